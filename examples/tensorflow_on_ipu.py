"""TensorFlow code on the simulated IPU, as written for Graphcore's SDK.

    KERAS_BACKEND=tensorflow python examples/tensorflow_on_ipu.py

A custom training loop (tf.function, GradientTape, a tf.keras model,
optimizer.apply_gradients, an outfeed of the losses) run by IPUStrategy:
TensorFlow lowers it to XLA HLO, keras_ipu's TensorFlow front end imports
it, each `strategy.run` is one program on the simulated IPU that streams
`steps_per_execution` batches from the dataset. Then `model.fit` of the
same model through the same path, and what the simulator predicts for the
program. The imports are Graphcore's: no edit needed.
"""

import numpy as np
import tensorflow as tf
from tensorflow import keras
from tensorflow.python import ipu

STEPS_PER_EXECUTION = 8


def dataset():
    # Stripes: class 1 when the image has a bright horizontal band.
    rng = np.random.default_rng(0)
    x = rng.normal(0, 0.3, size=(512, 8, 8, 1)).astype(np.float32)
    y = rng.integers(0, 2, size=512).astype(np.int32)
    x[y == 1, 3:5, :, 0] += 1.5
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(32, drop_remainder=True)


def model_fn():
    return keras.Sequential([
        keras.Input((8, 8, 1)),
        keras.layers.Conv2D(4, 3, activation="relu"),
        keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(2),
    ])


@tf.function(jit_compile=True)
def training_loop(iterator, outfeed_queue, model, optimizer, steps):
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    for _ in tf.range(steps):
        images, labels = next(iterator)
        with tf.GradientTape() as tape:
            loss = loss_fn(labels, model(images, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        outfeed_queue.enqueue(loss)


def main():
    print("backend:", keras.backend.backend())
    cfg = ipu.config.IPUConfig()
    cfg.auto_select_ipus = 1
    cfg.configure_ipu_system()
    strategy = ipu.ipu_strategy.IPUStrategy()
    with strategy.scope():
        keras.utils.set_random_seed(1)
        model = model_fn()
        optimizer = keras.optimizers.SGD(0.1)
        outfeed = ipu.ipu_outfeed_queue.IPUOutfeedQueue()
        iterator = iter(dataset().repeat())
        for _ in range(6):
            strategy.run(training_loop, args=[iterator, outfeed, model, optimizer,
                                              STEPS_PER_EXECUTION])
        losses = outfeed.dequeue().numpy()
        print(f"custom loop: {len(losses)} steps in 6 programs, "
              f"training loss: {losses[:8].mean():.3f} -> {losses[-8:].mean():.3f}")

        model.compile(optimizer=keras.optimizers.SGD(0.1), metrics=["accuracy"],
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      steps_per_execution=STEPS_PER_EXECUTION)
        model.fit(dataset(), epochs=2, verbose=0)
        loss, accuracy = model.evaluate(dataset(), verbose=0)
        print(f"fit: loss={loss:.3f} accuracy={accuracy:.3f}")

    from keras_ipu.frontends.tensorflow.function import bridge

    (executable,) = bridge(training_loop).executables()
    memory = executable.memory
    print(f"the custom loop's program: {memory.total_bytes / 2**20:.1f} MiB on the IPU, fullest tile "
          f"{memory.tile_bytes / 2**10:.1f} KiB of {memory.tile_capacity / 2**10:.0f} KiB")


if __name__ == "__main__":
    main()
