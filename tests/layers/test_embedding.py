"""keras_ipu.layers.Embedding: Keras' numbers, serialized lookups, and
Graphcore's refusals."""

import keras
import numpy as np
import pytest

from keras_ipu import layers
from keras_ipu.device.autodiff import value_and_grad
from layer_checks import config_round_trip
from layer_checks import saved_and_loaded

IDS = np.random.default_rng(0).integers(0, 12, (4, 5)).astype("int32")


def _pair(**kwargs):
    ours = layers.Embedding(12, 3, **kwargs)
    theirs = keras.layers.Embedding(12, 3)
    ours.build(IDS.shape)
    theirs.build(IDS.shape)
    ours.set_weights(theirs.get_weights())
    return ours, theirs


@pytest.mark.parametrize("factor", [1, 2, 4, 12])
def test_same_values_and_gradients_as_keras_embedding(factor):
    ours, theirs = _pair(serialization_factor=factor)
    np.testing.assert_array_equal(np.asarray(ours(IDS)), np.asarray(theirs(IDS)))
    table = theirs.get_weights()[0]
    weights = np.random.default_rng(1).normal(size=(4, 5, 3)).astype("float32")

    def loss(layer):
        def f(t):
            from keras_ipu.layers.embedding import embedding_lookup
            if layer is ours:
                out = embedding_lookup(t, IDS, factor)
            else:
                out = keras.ops.take(t, IDS, axis=0)
            return keras.ops.sum(out * weights)
        return f

    _, g_ours = value_and_grad(loss(ours))(table)
    _, g_theirs = value_and_grad(loss(theirs))(table)
    np.testing.assert_allclose(np.asarray(g_ours), np.asarray(g_theirs), rtol=1e-6)


def test_graphcore_errors():
    with pytest.raises(ValueError, match=r"The serialization_factor \(5\) must divide "
                       r"the size of the 0th dimension of params \(12\)."):
        layers.Embedding(12, 3, serialization_factor=5)(IDS)
    with pytest.raises(ValueError, match="serialization_factor has to be at least 1, but was 0."):
        layers.Embedding(12, 3, serialization_factor=0)(IDS)
    with pytest.raises(ValueError, match=r"shape \[batch, input_length\]"):
        layers.Embedding(12, 3)(IDS[0])
    for arg in ("mask_zero", "input_length", "embeddings_regularizer",
                "activity_regularizer", "embeddings_constraint"):
        value = {"mask_zero": True, "input_length": 5}.get(arg, "l2")
        with pytest.raises(NotImplementedError, match=(
                f"keras_ipu.layers.Embedding does not support __init__ argument {arg}. "
                "It is included for API consistency with keras.Embedding.")):
            layers.Embedding(12, 3, **{arg: value})


def test_trains_compiled_and_saves(tmp_path):
    model = keras.Sequential([keras.Input((5,), dtype="int32"),
                              layers.Embedding(12, 3, serialization_factor=3),
                              keras.layers.Flatten(), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    model.fit(IDS, np.ones((4, 1), "float32"), epochs=2, verbose=0)
    loaded = saved_and_loaded(model, tmp_path, IDS)
    assert loaded.layers[0].serialization_factor == 3
    config_round_trip(layers.Embedding(12, 3, serialization_factor=2))
