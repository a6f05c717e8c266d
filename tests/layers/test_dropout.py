"""keras_ipu.layers.Dropout: Graphcore's seed pair, rate and noise_shape
rules; the numbers of Keras' dropout."""

import keras
import numpy as np
import pytest
from keras.src import backend

from keras_ipu import layers
from layer_checks import config_round_trip
from layer_checks import saved_and_loaded

X = np.random.default_rng(0).uniform(1, 2, (8, 16)).astype("float32")


def test_a_seed_pair_gives_the_mask_of_that_key_on_every_call():
    layer = layers.Dropout(0.4, seed=[3, 7])
    want = backend.random.dropout(X, 0.4, seed=np.array([3, 7], np.uint32))
    first = layer(X, training=True)
    np.testing.assert_array_equal(np.asarray(first), np.asarray(want))
    np.testing.assert_array_equal(np.asarray(layer(X, training=True)), np.asarray(first))
    kept = np.asarray(first) != 0
    np.testing.assert_allclose(np.asarray(first)[kept], X[kept] / 0.6, rtol=1e-6)


def test_without_a_seed_it_draws_like_keras_dropout():
    ours = layers.Dropout(0.5)
    theirs = keras.layers.Dropout(0.5, seed=1)
    ours.seed_generator.state.assign(theirs.seed_generator.state.value)
    for _ in range(2):  # the state advances the same way
        np.testing.assert_array_equal(
            np.asarray(ours(X, training=True)), np.asarray(theirs(X, training=True)))
    assert not np.array_equal(np.asarray(ours(X, training=True)),
                              np.asarray(ours(X, training=True)))


def test_inference_passes_the_input():
    layer = layers.Dropout(0.9, seed=(1, 2))
    np.testing.assert_array_equal(np.asarray(layer(X)), X)
    np.testing.assert_array_equal(np.asarray(layer(X, training=False)), X)


def test_noise_shape_broadcasts_the_mask():
    out = np.asarray(layers.Dropout(0.5, noise_shape=(8, 1), seed=(0, 1))(X, training=True))
    dropped = out == 0
    assert dropped.any() and not dropped.all()
    assert (dropped.all(axis=1) | ~dropped.any(axis=1)).all()  # whole rows


def test_graphcore_errors():
    with pytest.raises(ValueError, match=r"The rate must be in the range \[0, 1\), but was 1.0"):
        layers.Dropout(1.0)
    with pytest.raises(ValueError, match=r"Expected the seed to have a shape \[2\], but got \[3\]"):
        layers.Dropout(0.5, seed=[1, 2, 3])
    with pytest.raises(ValueError, match="The length of noise_shape must equal the rank of x."):
        layers.Dropout(0.5, noise_shape=(8,))(X, training=True)
    with pytest.raises(ValueError, match="Dimension mismatch, 16 != 4."):
        layers.Dropout(0.5, noise_shape=(8, 4))(X, training=True)


def test_trains_compiled_and_saves(tmp_path):
    model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(8),
                              layers.Dropout(0.25, seed=(5, 6)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    history = model.fit(X, X[:, :1], epochs=2, verbose=0)
    assert np.isfinite(history.history["loss"]).all()
    loaded = saved_and_loaded(model, tmp_path, X)
    assert loaded.layers[1].seed == [5, 6]
    config_round_trip(layers.Dropout(0.3, noise_shape=(None, 1), seed=(1, 2)))
