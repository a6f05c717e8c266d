"""SerialDense: keras.layers.Dense's numbers from serialization_factor
products of slices, forward and backward; Graphcore's errors."""

import keras
import numpy as np
import pytest

from keras_ipu import layers
from keras_ipu.device.ir import ShapedArray
from keras_ipu.device.trace import trace_flat
from keras_ipu.layers.serial_dense import serialized_matmul
from layer_checks import config_round_trip
from layer_checks import saved_and_loaded

RNG = np.random.default_rng(0)
X2 = RNG.normal(size=(8, 12)).astype("float32")
X3 = RNG.normal(size=(2, 8, 12)).astype("float32")
DIMENSIONS = ["input_columns", "input_rows_kernel_columns", "kernel_rows"]


def _pair(dimension, x, factor=4):
    ours = layers.SerialDense(16, factor, dimension, activation="relu")
    theirs = keras.layers.Dense(16, activation="relu")
    ours.build(x.shape)
    theirs.build(x.shape)
    theirs.set_weights([RNG.normal(size=w.shape).astype("float32")
                        for w in theirs.get_weights()])
    ours.set_weights(theirs.get_weights())
    return ours, theirs


@pytest.mark.parametrize("dimension", DIMENSIONS)
@pytest.mark.parametrize("x", [X2, X3], ids=["2d", "3d"])
def test_same_values_as_dense(dimension, x):
    ours, theirs = _pair(dimension, x)
    np.testing.assert_allclose(np.asarray(ours(x)), np.asarray(theirs(x)),
                               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dimension", DIMENSIONS)
def test_trains_like_dense(dimension):
    def trained(layer_of):
        keras.utils.set_random_seed(2)
        model = keras.Sequential([keras.Input((12,)), layer_of()])
        model.compile(optimizer="sgd", loss="mse")
        model.fit(X2, X2[:, :4], batch_size=8, epochs=3, verbose=0)
        return model.get_weights()

    ours = trained(lambda: layers.SerialDense(4, 2 if dimension != "kernel_rows" else 4,
                                              dimension))
    theirs = trained(lambda: keras.layers.Dense(4))
    for a, b in zip(ours, theirs):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dimension, sliced", [
    ("a_columns", ((2, 16), (12, 16))),        # rows of a
    ("a_rows_b_columns", ((8, 3), (3, 16))),   # the inner dimension
    ("b_rows", ((8, 12), (12, 4))),            # columns of b
])
def test_the_program_holds_factor_smaller_products(dimension, sliced):
    graph, _ = trace_flat(
        lambda a, b: [serialized_matmul(a, b, 4, dimension)],
        [ShapedArray((8, 12), np.float32), ShapedArray((12, 16), np.float32)])
    dots = [n for n in graph.nodes if n.primitive.name == "dot_general"]
    assert len(dots) == 4
    for node in dots:
        a_shape, b_shape = (tuple(v.aval.shape) for v in node.inputs)
        if dimension == "a_columns":
            assert a_shape == sliced[0][:1] + (12,) and b_shape == sliced[1]
        elif dimension == "a_rows_b_columns":
            assert (a_shape, b_shape) == sliced
        else:
            assert (a_shape, b_shape) == sliced


def test_graphcore_errors():
    with pytest.raises(ValueError, match=r"Invalid serialization_dimension=rows, "
                       "expected one of: 'input_columns', 'input_rows_kernel_columns', "
                       "'kernel_rows'."):
        layers.SerialDense(16, 2, "rows")(X2)
    with pytest.raises(ValueError, match="serialization_factor has to be at least 1, but was 0."):
        layers.SerialDense(16, 0, "kernel_rows")(X2)
    with pytest.raises(ValueError, match=r"Expected 'serialization_factor' \(5\) to "
                       r"divide the columns dimension of 'a' \(8\)."):
        layers.SerialDense(16, 5, "input_columns")(X2)
    with pytest.raises(ValueError, match=r"divide the rows dimension of 'a' \(12\)."):
        layers.SerialDense(16, 5, "input_rows_kernel_columns")(X2)
    with pytest.raises(ValueError, match=r"divide the rows dimension of 'b' \(16\)."):
        layers.SerialDense(16, 5, "kernel_rows")(X2)
    with pytest.raises(TypeError, match="Unable to build `SerialDense` layer with "
                       "non-floating point dtype int32"):
        layers.SerialDense(16, 2, "kernel_rows", dtype="int32").build((2, 3))


def test_save_and_load(tmp_path):
    model = keras.Sequential([keras.Input((12,)),
                              layers.SerialDense(16, 4, "kernel_rows", activation="tanh"),
                              layers.SerialDense(2, 2, "input_rows_kernel_columns",
                                                 kernel_regularizer="l2")])
    saved_and_loaded(model, tmp_path, X2)
    config_round_trip(layers.SerialDense(3, 2, "input_columns", use_bias=False))
