"""A Keras training step split over two IPUs by the placement pass: the
model, its step and data, shared by the placement tests (test_placement.py)
and the profile views of a placed program (tests/report)."""

import keras
import numpy as np

from keras_ipu.device import autodiff
from keras_ipu.device.compiler.placement import Placement

# Layer d0 on IPU 0, d1 on IPU 1.
PLACEMENT = Placement.of({"net/d0": 0, "net/d1": 1}, device_mapping=(0, 1))


def model(hidden=32):
    """Input(16) -> Dense(hidden, relu) "d0" -> Dense(4) "d1", named "net"."""
    keras.utils.set_random_seed(1)
    return keras.Sequential(
        [keras.Input((16,)), keras.layers.Dense(hidden, activation="relu", name="d0"),
         keras.layers.Dense(4, name="d1")], name="net")


def train_step(model):
    """step(trainable, x, y) -> (mse loss, weights after one SGD step of 0.1)."""
    def loss_of(trainable, x, y):
        pred, _ = model.stateless_call(trainable, [], x)
        return keras.ops.mean(keras.ops.square(pred - y))

    def step(trainable, x, y):
        loss, grads = autodiff.value_and_grad(loss_of)(trainable, x, y)
        return loss, [w - 0.1 * g for w, g in zip(trainable, grads)]

    return step


def data():
    rng = np.random.default_rng(0)
    return (rng.standard_normal((8, 16)).astype(np.float32),
            rng.standard_normal((8, 4)).astype(np.float32))
