"""Group, instance and layer normalization: Keras' numbers (with
PopLibs' strided channel grouping as a permutation of channels), and
Graphcore's errors."""

import keras
import numpy as np
import pytest

from keras_ipu import layers
from layer_checks import config_round_trip
from layer_checks import saved_and_loaded

RNG = np.random.default_rng(0)
X = RNG.normal(size=(2, 5, 4, 6)).astype("float32")


def _same_weights(ours, theirs, x):
    ours.build(x.shape)
    theirs.build(x.shape)
    weights = [RNG.normal(size=w.shape).astype("float32") for w in theirs.get_weights()]
    theirs.set_weights(weights)
    ours.set_weights(weights)


def test_group_norm_with_neighbouring_groups_is_keras_group_norm():
    ours = layers.GroupNormalization(groups=3, strided_channel_grouping=False)
    theirs = keras.layers.GroupNormalization(groups=3, epsilon=1e-3)
    _same_weights(ours, theirs, X)
    np.testing.assert_allclose(np.asarray(ours(X)), np.asarray(theirs(X)),
                               rtol=1e-5, atol=1e-5)


def test_strided_grouping_is_keras_group_norm_of_permuted_channels():
    # Channel c is in group c % 3: ordering channels by (c % 3, c) makes
    # the groups contiguous.
    order = np.argsort(np.arange(6) % 3, kind="stable")
    ours = layers.GroupNormalization(groups=3, beta_initializer="zeros",
                                     gamma_initializer="ones")
    theirs = keras.layers.GroupNormalization(groups=3, epsilon=1e-3)
    want = np.asarray(theirs(X[..., order]))[..., np.argsort(order)]
    np.testing.assert_allclose(np.asarray(ours(X)), want, rtol=1e-5, atol=1e-5)


def test_channels_first():
    nchw = np.moveaxis(X, -1, 1)
    ours = layers.GroupNormalization(groups=2, channels_axis=1,
                                     strided_channel_grouping=False)
    theirs = keras.layers.GroupNormalization(groups=2, axis=1, epsilon=1e-3)
    _same_weights(ours, theirs, nchw)
    np.testing.assert_allclose(np.asarray(ours(nchw)), np.asarray(theirs(nchw)),
                               rtol=1e-5, atol=1e-5)


def test_instance_norm_is_one_group_per_channel():
    ours = layers.InstanceNormalization()
    theirs = keras.layers.GroupNormalization(groups=-1, epsilon=1e-3)
    _same_weights(ours, theirs, X)
    np.testing.assert_allclose(np.asarray(ours(X)), np.asarray(theirs(X)),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("axis", [-1, [1, 3], (2, 3)])
def test_layer_norm_is_keras_layer_norm(axis):
    ours = layers.LayerNormalization(axis=axis)
    theirs = keras.layers.LayerNormalization(axis=axis, epsilon=1e-3)
    _same_weights(ours, theirs, X)
    np.testing.assert_allclose(np.asarray(ours(X)), np.asarray(theirs(X)),
                               rtol=1e-5, atol=1e-5)


def test_default_parameters_use_keras_default_initializer():
    # As Graphcore's layer: beta/gamma initializer None is Keras' default
    # for a float weight (glorot_uniform), not ones and zeros.
    layer = layers.GroupNormalization(groups=2)
    layer.build(X.shape)
    gamma, beta = layer.get_weights()
    assert not np.allclose(gamma, 1) and not np.allclose(beta, 0)
    assert gamma.shape == beta.shape == (6,)
    assert layers.GroupNorm is layers.GroupNormalization
    assert layers.InstanceNorm is layers.InstanceNormalization
    assert layers.LayerNorm is layers.LayerNormalization


def test_graphcore_errors():
    with pytest.raises(ValueError, match="Invalid groups 7 for 6 channels."):
        layers.GroupNormalization(groups=7)(X)
    with pytest.raises(ValueError, match="6 channels is not commensurate with 4 groups."):
        layers.GroupNormalization(groups=4)(X)
    with pytest.raises(ValueError, match="Unsupported data format, group norm only "
                       r"supports NCHW\(channel axis 1\) and NHWC"):
        layers.GroupNormalization(groups=1, channels_axis=2)(X)
    with pytest.raises(ValueError, match="Axis is out of bounds."):
        layers.GroupNormalization(groups=1, channels_axis=4)(X)
    with pytest.raises(ValueError, match="Duplicate axis"):
        layers.LayerNormalization(axis=[3, -1])(X)
    with pytest.raises(ValueError, match="Invalid axis: 5"):
        layers.LayerNormalization(axis=5)(X)
    with pytest.raises(ValueError, match="Expected an int or a list/tuple of ints"):
        layers.LayerNormalization(axis="last")
    with pytest.raises(NotImplementedError, match=(
            "keras_ipu.layers.LayerNormalization does not support __init__ "
            "argument gamma_regularizer")):
        layers.LayerNormalization(gamma_regularizer="l2")


def test_train_compiled_and_save(tmp_path):
    inp = keras.Input((5, 4, 6))
    x = layers.GroupNormalization(groups=2)(inp)
    x = layers.InstanceNormalization()(x)
    x = layers.LayerNormalization(axis=[2, 3])(x)
    out = keras.layers.Dense(1)(keras.layers.Flatten()(x))
    model = keras.Model(inp, out)
    model.compile(optimizer="adam", loss="mse")
    model.fit(X, np.ones((2, 1), "float32"), epochs=2, verbose=0)
    saved_and_loaded(model, tmp_path, X)
    for layer in (layers.GroupNormalization(groups=3, strided_channel_grouping=False),
                  layers.InstanceNormalization(channels_axis=1, epsilon=0.1),
                  layers.LayerNormalization(axis=[1, 2], center=False)):
        config_round_trip(layer)
