"""Gradient accumulation on one IPU: set_gradient_accumulation_options makes
fit update the weights once every `gradient_accumulation_steps_per_replica`
batches, with the gradients combined by SUM, MEAN or RUNNING_MEAN.

    KERAS_BACKEND=ipu python examples/gradient_accumulation.py

MEAN over 4 batches of 16 trains as one batch of 64 (the printed weights
agree to float32 rounding); the prediction shows the weight update paid once
per 4 micro-batches.
"""

import os

os.environ.setdefault("KERAS_BACKEND", "ipu")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import keras_ipu as ipu  # noqa: E402
from synthetic_mnist import load  # noqa: E402


def make(strategy):
    keras.utils.set_random_seed(1)
    with strategy.scope():
        model = keras.Sequential([keras.Input((28, 28, 1)), keras.layers.Flatten(),
                                  keras.layers.Dense(32, activation="relu"),
                                  keras.layers.Dense(10)])
        model.compile(keras.optimizers.SGD(0.05, momentum=0.9),
                      keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"], steps_per_execution=16)
    return model


def main():
    (x, y), _ = load(n_train=1024)
    strategy = ipu.ipu_strategy.IPUStrategy()
    accumulated = make(strategy)
    with strategy.scope():
        accumulated.set_gradient_accumulation_options(
            gradient_accumulation_steps_per_replica=4,
            gradient_accumulation_reduction_method="mean")
        history = accumulated.fit(x, y, batch_size=16, epochs=1, verbose=0, shuffle=False)
    print(f"4 x 16, MEAN: loss {history.history['loss'][-1]:.4f}")
    big = make(strategy)
    with strategy.scope():
        big.compile(big.optimizer, big.loss, metrics=["accuracy"], steps_per_execution=4)
        big.fit(x, y, batch_size=64, epochs=1, verbose=0, shuffle=False)
    difference = max(float(np.max(np.abs(a - b)))
                     for a, b in zip(accumulated.get_weights(), big.get_weights()))
    print(f"largest weight difference from batch 64: {difference:.2e}")
    print(ipu.models.predict_training(accumulated, 16))


if __name__ == "__main__":
    main()
