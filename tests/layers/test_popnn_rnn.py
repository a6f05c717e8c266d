"""PopnnLSTM and PopnnGRU: Keras' LSTM and GRU numbers with the same
weights, PopLibs' restrictions with Graphcore's messages."""

import keras
import numpy as np
import pytest

from keras_ipu import layers
from layer_checks import config_round_trip
from layer_checks import saved_and_loaded

RNG = np.random.default_rng(0)
X = RNG.normal(size=(3, 5, 4)).astype("float32")
H0 = RNG.normal(size=(3, 6)).astype("float32")
C0 = RNG.normal(size=(3, 6)).astype("float32")

CASES = [
    (layers.PopnnLSTM, keras.layers.LSTM, {}),
    (layers.PopnnGRU, keras.layers.GRU, {"reset_after": True}),
    (layers.PopnnGRU, keras.layers.GRU, {"reset_after": False}),
]


def _pair(ours_cls, theirs_cls, kwargs, **common):
    theirs = theirs_cls(6, **kwargs, **common)
    ours = ours_cls(6, **kwargs, **common)
    theirs.build(X.shape)
    ours.build(X.shape)
    weights = [RNG.normal(size=w.shape).astype("float32") * 0.5
               for w in theirs.get_weights()]
    theirs.set_weights(weights)
    ours.set_weights(weights)
    return ours, theirs


def _assert_same(a, b):
    for x, y in zip(keras.tree.flatten(a), keras.tree.flatten(b)):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("ours_cls, theirs_cls, kwargs", CASES)
@pytest.mark.parametrize("return_sequences", [False, True])
def test_same_numbers_as_keras(ours_cls, theirs_cls, kwargs, return_sequences):
    ours, theirs = _pair(ours_cls, theirs_cls, kwargs,
                         return_sequences=return_sequences, return_state=True)
    _assert_same(ours(X), theirs(X))
    state = [H0, C0] if ours_cls is layers.PopnnLSTM else [H0]
    _assert_same(ours(X, initial_state=state), theirs(X, initial_state=state))


def test_time_major():
    ours, theirs = _pair(layers.PopnnLSTM, keras.layers.LSTM, {},
                         return_sequences=True)
    ours.time_major = True
    _assert_same(np.swapaxes(np.asarray(ours(np.swapaxes(X, 0, 1))), 0, 1), theirs(X))


def test_unit_forget_bias_and_gradients_in_training():
    layer = layers.PopnnLSTM(6)
    layer.build(X.shape)
    bias = layer.get_weights()[2]
    np.testing.assert_array_equal(bias[6:12], 1.0)  # the forget gate
    np.testing.assert_array_equal(np.delete(bias, range(6, 12)), 0.0)

    def train(rnn_cls, keras_cls, kwargs):
        keras.utils.set_random_seed(1)
        model = keras.Sequential([keras.Input((5, 4)), rnn_cls(6, **kwargs),
                                  keras.layers.Dense(1)])
        return model

    for ours_cls, theirs_cls, kwargs in CASES:
        ours = train(ours_cls, theirs_cls, kwargs)
        theirs = train(theirs_cls, theirs_cls, kwargs)
        ours.set_weights(theirs.get_weights())
        for m in (ours, theirs):
            m.compile(optimizer="sgd", loss="mse")
            m.fit(X, X[:, 0, :1], epochs=2, verbose=0)
        for a, b in zip(ours.get_weights(), theirs.get_weights()):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_dropout_one_mask_for_all_steps():
    layer = layers.PopnnGRU(6, dropout=0.5, dropout_seed=(1, 2),
                            return_sequences=True)
    plain = layers.PopnnGRU(6, return_sequences=True)
    layer.build(X.shape)
    plain.build(X.shape)
    plain.set_weights(layer.get_weights())
    # A constant input per feature: dropping features for every step is
    # the same as zeroing them in the input.
    x = np.repeat(X[:, :1], 5, axis=1)
    dropped = np.asarray(layer(x, training=True))
    assert not np.allclose(dropped, np.asarray(plain(x)))
    np.testing.assert_array_equal(np.asarray(layer(x, training=True)), dropped)
    np.testing.assert_array_equal(np.asarray(layer(x, training=False)),
                                  np.asarray(plain(x)))


def test_stateful_carries_the_state():
    ours, theirs = _pair(layers.PopnnLSTM, keras.layers.LSTM, {}, stateful=True)
    for _ in range(2):
        _assert_same(ours(X), theirs(X))
    ours.reset_states()
    theirs.reset_states()
    _assert_same(ours(X), theirs(X))


@pytest.mark.parametrize("kind, cls", [("LSTM", layers.PopnnLSTM), ("GRU", layers.PopnnGRU)])
def test_graphcore_restrictions(kind, cls):
    refused = {
        "use_bias": (False, f"IPU custom {kind} layer does not support use_bias = False."),
        "kernel_regularizer": ("l2", f"IPU custom {kind} layer does not support kernel_regularizer."),
        "bias_constraint": ("non_neg", f"IPU custom {kind} layer does not support bias_constraint."),
        "implementation": (3, f"IPU custom {kind} layer does not support implementation != 1."),
        "unroll": (True, f"IPU custom {kind} layer does not support unroll"),
        "go_backwards": (True, f"IPU custom {kind} layer does not support go_backwards"),
        "recurrent_dropout": (0.1, f"IPU custom {kind} layer does not support recurrent_dropout"),
    }
    for arg, (value, message) in refused.items():
        with pytest.raises(ValueError, match=message.replace(".", r"\.")):
            cls(4, **{arg: value})
    with pytest.raises(ValueError, match="does not support 'elu' as an activation. "
                       'Acceptable value are "tanh","relu","softmax","sigmoid","hard_sigmoid"'):
        cls(4, activation="elu")
    with pytest.raises(ValueError, match="does not support 'relu' as a recurrent activation"):
        cls(4, recurrent_activation=keras.activations.relu)
    with pytest.raises(ValueError, match="Expecting input_shape with 3 dims, got 2"):
        cls(4)(X[0])
    with pytest.raises(NotImplementedError, match=f"Popnn{kind} does not support call argument mask"):
        cls(4)(X, mask=np.ones((3, 5), bool))
    assert layers.LSTM is layers.PopnnLSTM and layers.GRU is layers.PopnnGRU


def test_save_and_load(tmp_path):
    model = keras.Sequential([keras.Input((5, 4)),
                              layers.PopnnLSTM(6, return_sequences=True),
                              layers.PopnnGRU(3, reset_after=False)])
    saved_and_loaded(model, tmp_path, X)
    config_round_trip(layers.PopnnLSTM(3, dropout=0.2, dropout_seed=(4, 5),
                                       unit_forget_bias=False, time_major=True))
    config_round_trip(layers.PopnnGRU(3, reset_after=False, partials_dtype="float16"))
