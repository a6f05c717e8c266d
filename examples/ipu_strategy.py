"""One IPU with IPUStrategy: a Keras model made in the strategy's scope
trains with fit (steps_per_execution steps per program run), and a custom
JAX-style training step runs through strategy.run.

    KERAS_BACKEND=ipu python examples/ipu_strategy.py

Prints what the simulator predicts for the training on a real IPU
(cycles, memory, samples/s).
"""

import os

os.environ.setdefault("KERAS_BACKEND", "ipu")

import keras  # noqa: E402
from keras import ops  # noqa: E402

import keras_ipu as ipu  # noqa: E402
from keras_ipu.device.autodiff import value_and_grad  # noqa: E402
from synthetic_mnist import load  # noqa: E402


def main():
    (x, y), (x_test, y_test) = load()
    config = ipu.config.IPUConfig()
    config.auto_select_ipus = 1
    config.configure_ipu_system()

    strategy = ipu.ipu_strategy.IPUStrategy()
    with strategy.scope():
        model = keras.Sequential([
            keras.Input((28, 28, 1)),
            keras.layers.Conv2D(8, 3, activation="relu"),
            keras.layers.MaxPooling2D(2),
            keras.layers.Flatten(),
            keras.layers.Dense(10),
        ])
        loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        model.compile(keras.optimizers.SGD(0.05), loss, metrics=["accuracy"],
                      steps_per_execution=16)
        model.fit(x, y, batch_size=32, epochs=1, verbose=0)
        print(f"fit: test accuracy {model.evaluate(x_test, y_test, batch_size=32, verbose=0)[1]:.3f}")
        # What the simulator predicts for this training on a real IPU.
        print(ipu.models.predict_training(model, 32))

        # A custom step, written as a JAX user of Keras writes it, compiled
        # and run on the IPU by strategy.run.
        optimizer = model.optimizer

        def compute_loss(trainable, non_trainable, x, y):
            logits, non_trainable = model.stateless_call(trainable, non_trainable, x)
            return loss(y, logits), non_trainable

        def train_step(state, x, y):
            trainable, non_trainable, opt_vars = state
            (value, non_trainable), grads = value_and_grad(compute_loss, has_aux=True)(
                trainable, non_trainable, x, y)
            trainable, opt_vars = optimizer.stateless_apply(opt_vars, grads, trainable)
            return value, (trainable, non_trainable, opt_vars)

        state = ([v.value for v in model.trainable_variables],
                 [v.value for v in model.non_trainable_variables],
                 [v.value for v in optimizer.variables])
        losses = []
        for step in range(8):
            batch = slice(32 * step, 32 * step + 32)
            value, state = strategy.run(train_step, args=(state, x[batch], y[batch]))
            losses.append(float(value))
        print(f"strategy.run: loss {losses[0]:.3f} -> {losses[-1]:.3f}")
        pred = strategy.run(lambda x: ops.argmax(model(x), axis=-1), args=(x_test[:32],))
        print(f"strategy.run inference: {int(ops.sum(pred == y_test[:32]))}/32 right")


if __name__ == "__main__":
    main()
