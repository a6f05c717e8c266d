"""tf.keras code through the TensorFlow front end, run as a script under
KERAS_BACKEND=tensorflow (the test session itself runs the ipu backend):

    KERAS_BACKEND=tensorflow python keras_tf_scenarios.py NAME [NAME ...]

prints one JSON object {name: result} on its last line. Used by
test_keras_tensorflow.py.
"""

import json
import os
import sys

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def _conv_net(keras, dropout):
    layers = [
        keras.Input((12, 12, 3)),
        keras.layers.Conv2D(8, 3, activation="relu"),
        keras.layers.BatchNormalization(),
        keras.layers.MaxPooling2D(),
        keras.layers.Conv2D(8, 3, padding="same", strides=2),
        keras.layers.Flatten(),
    ]
    if dropout:
        layers.append(keras.layers.Dropout(0.2))
    layers.append(keras.layers.Dense(10))
    return keras.Sequential(layers)


def _loss_curve(mode, dropout, steps=20):
    """Training losses of a conv net: `mode` "xla" (TensorFlow compiles the
    step with XLA), "tf" (TensorFlow without XLA) or "ipu" (the bridge)."""
    import keras
    import tensorflow as tf

    from keras_ipu.frontends.tensorflow.function import bridge

    keras.utils.set_random_seed(7)
    model = _conv_net(keras, dropout)
    opt = keras.optimizers.Adam(0.01)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    fn = tf.function(step, jit_compile=(mode != "tf"))
    if mode == "ipu":
        fn = bridge(fn)
    rng = np.random.default_rng(3)
    xs = rng.normal(size=(steps, 8, 12, 12, 3)).astype(np.float32)
    ys = rng.integers(0, 10, size=(steps, 8)).astype(np.int32)
    return [float(fn(xs[i], ys[i])) for i in range(steps)]


def conv_net_losses():
    out = {}
    out["ipu_dropout"] = _loss_curve("ipu", True)
    out["xla_dropout"] = _loss_curve("xla", True)
    out["ipu"] = _loss_curve("ipu", False)
    out["tf"] = _loss_curve("tf", False)
    return out


def graphcore_custom_loop():
    """Graphcore's TF2 infeed/outfeed tutorial (mnist_with_feeds.py), with
    small synthetic data, after the porting contract's edits (none for
    TensorFlow code)."""
    import tensorflow as tf
    from tensorflow import keras
    from tensorflow.python.ipu import ipu_outfeed_queue

    from keras_ipu.frontends.tensorflow.function import bridge
    from keras_ipu.frontends.tensorflow.strategy_run import run

    class Strategy:  # IPUStrategy's TensorFlow path
        def run(self, fn, args=(), kwargs=None):
            return run(self, fn, args, kwargs)

    rng = np.random.default_rng(0)
    x_train = rng.integers(0, 255, size=(256, 28, 28)).astype(np.float32) / 255.0
    y_train = rng.integers(0, 10, size=256)
    ds = tf.data.Dataset.from_tensor_slices((x_train, y_train)).batch(32, drop_remainder=True)
    ds = ds.map(lambda d, l: (tf.cast(d, tf.float32), tf.cast(l, tf.int32))).repeat()

    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.layers.Flatten(), keras.layers.Dense(128, activation="relu"),
                              keras.layers.Dense(10, activation="softmax")])
    opt = keras.optimizers.SGD(0.01)

    @tf.function(jit_compile=True)
    def training_loop(iterator, outfeed_queue, model, optimizer, steps_per_execution):
        for _ in tf.range(steps_per_execution):
            features, labels = next(iterator)
            with tf.GradientTape() as tape:
                predictions = model(features, training=True)
                loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(labels, predictions))
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            outfeed_queue.enqueue(loss)

    strategy = Strategy()
    iterator = iter(ds)
    outfeed_queue = ipu_outfeed_queue.IPUOutfeedQueue()
    for _ in range(0, 30, 10):
        strategy.run(training_loop, args=[iterator, outfeed_queue, model, opt, 10])
    losses = outfeed_queue.dequeue().numpy()

    # The same 30 steps by TensorFlow, from the same weights and data.
    keras.utils.set_random_seed(1)
    ref = keras.Sequential([keras.layers.Flatten(), keras.layers.Dense(128, activation="relu"),
                            keras.layers.Dense(10, activation="softmax")])
    ref_opt = keras.optimizers.SGD(0.01)

    @tf.function
    def ref_step(features, labels):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(
                labels, ref(features, training=True)))
        grads = tape.gradient(loss, ref.trainable_variables)
        ref_opt.apply_gradients(zip(grads, ref.trainable_variables))
        return loss

    ref_losses = [float(ref_step(f, l)) for f, l in ds.take(30)]
    return {"losses": losses.tolist(), "reference": ref_losses,
            "iterations": int(opt.iterations.numpy()),
            "programs": bridge(training_loop).compile_count}


SCENARIOS = {"conv_net_losses": conv_net_losses, "graphcore_custom_loop": graphcore_custom_loop}


if __name__ == "__main__":
    results = {name: SCENARIOS[name]() for name in sys.argv[1:]}
    print(json.dumps(results))
