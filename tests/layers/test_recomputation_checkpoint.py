"""RecomputationCheckpoint in a Keras model: same training, and with
IPUConfig.allow_recompute the compiled training step holds fewer live
activations (the checkpoints bound the recomputed segments)."""

import keras
import numpy as np
import pytest

from keras_ipu import layers
from keras_ipu.config import IPUConfig
from layer_checks import config_round_trip
from layer_checks import saved_and_loaded

BATCH, WIDTH, DEPTH = 512, 32, 8
X = np.random.default_rng(0).uniform(-1, 1, (BATCH, WIDTH)).astype("float32")
Y = np.random.default_rng(1).uniform(-1, 1, (BATCH, 4)).astype("float32")


@pytest.fixture
def recompute(request):
    config = IPUConfig()
    config.allow_recompute = request.param
    config.configure_ipu_system()
    yield request.param
    IPUConfig().configure_ipu_system()


def _model(checkpoints):
    keras.utils.set_random_seed(3)
    inp = keras.Input((WIDTH,))
    x = inp
    for i in range(DEPTH):
        x = keras.layers.Dense(WIDTH, activation="tanh")(x)
        if checkpoints and i % 2 == 1 and i < DEPTH - 1:
            x = layers.RecomputationCheckpoint()(x)
    model = keras.Model(inp, keras.layers.Dense(4)(x))
    model.compile(optimizer="sgd", loss="mse")
    return model


def _train(checkpoints):
    model = _model(checkpoints)
    model.fit(X, Y, batch_size=BATCH, epochs=2, verbose=0)
    return model.get_weights(), model


def _train_step_memory():
    from keras_ipu.device.compiler.cache import CACHE

    programs = [e for e in CACHE._memory.values() if e.name == "train_step_loop"]
    return programs[-1].memory.not_always_live_bytes


@pytest.mark.parametrize("recompute", [False, True], indirect=True)
def test_checkpoints_do_not_change_training(recompute):
    plain, _ = _train(False)
    checkpointed, _ = _train(True)
    for a, b in zip(plain, checkpointed):
        np.testing.assert_array_equal(a, b)


def test_checkpoints_lower_the_live_activations_with_recomputation():
    memory = {}
    try:
        for allow in (False, True):
            config = IPUConfig()
            config.allow_recompute = allow
            config.configure_ipu_system()
            for checkpoints in (False, True):
                _train(checkpoints)
                memory[allow, checkpoints] = _train_step_memory()
    finally:
        IPUConfig().configure_ipu_system()
    activation = BATCH * WIDTH * 4
    # Without recomputation checkpoints change nothing; with it, the
    # backward pass holds 4 checkpoints and one 2-layer segment instead of
    # every layer's activations: at least 3 activations fewer.
    assert memory[False, True] == memory[False, False]
    assert memory[True, True] <= memory[False, False] - 3 * activation


def test_values_pass_through_and_save(tmp_path):
    x = np.arange(6, dtype="float32").reshape(2, 3)
    np.testing.assert_array_equal(np.asarray(layers.RecomputationCheckpoint()(x)), x)
    pair = layers.RecomputationCheckpoint()([x, x + 1])
    np.testing.assert_array_equal(np.asarray(pair[1]), x + 1)
    model = _model(True)
    saved_and_loaded(model, tmp_path, X[:8])
    config_round_trip(layers.RecomputationCheckpoint(name="ckpt"))


def test_graphcore_conv_checkpoint_lowers_peak_liveness():
    # Graphcore's testRecomputationCheckpoint (keras pipeline recomputation
    # test), on one IPU with allow_recompute: six Conv2D layers with a
    # checkpoint after the third train to the same weights with a lower
    # peak of not-always-live memory.
    config = IPUConfig()
    config.allow_recompute = True
    config.configure_ipu_system()
    x = np.ones((4, 64, 64, 3), "float32")
    y = np.full((4, 1), 0.2, "float32")

    def trained(checkpoints):
        keras.utils.set_random_seed(0)
        inp = keras.Input((64, 64, 3))
        h = inp
        for i in range(6):
            h = keras.layers.Conv2D(4, 3, activation="relu")(h)
            if checkpoints and i == 2:
                h = layers.RecomputationCheckpoint()(h)
        h = keras.layers.Dense(1, activation="relu")(keras.layers.Flatten()(h))
        model = keras.Model(inp, h)
        model.compile(keras.optimizers.SGD(0.001), loss="mse")
        model.fit(x, y, batch_size=1, verbose=0)
        return _train_step_memory(), model.get_weights()

    try:
        plain_peak, plain = trained(False)
        checkpointed_peak, checkpointed = trained(True)
    finally:
        IPUConfig().configure_ipu_system()
    assert checkpointed_peak < plain_peak
    for a, b in zip(plain, checkpointed):
        np.testing.assert_array_equal(a, b)


def test_recomputed_dropout_and_batch_norm_train_the_same():
    # Recomputed dropout masks come from the same keys; batch-norm moving
    # statistics are outputs, kept as they are.
    x = np.random.default_rng(0).normal(size=(64, 16)).astype("float32")

    def trained(allow):
        config = IPUConfig()
        config.allow_recompute = allow
        config.configure_ipu_system()
        keras.utils.set_random_seed(0)
        inp = keras.Input((16,))
        h = inp
        for i in range(4):
            h = keras.layers.Dense(16, activation="tanh")(h)
            h = keras.layers.Dropout(0.3)(h) if i % 2 else layers.Dropout(0.3)(h)
            if i == 1:
                h = layers.RecomputationCheckpoint()(h)
            h = keras.layers.BatchNormalization()(h)
        model = keras.Model(inp, keras.layers.Dense(2)(h))
        model.compile("adam", "mse")
        model.fit(x, x[:, :2], batch_size=16, epochs=2, verbose=0)
        return model.get_weights()

    try:
        plain, recomputed = trained(False), trained(True)
    finally:
        IPUConfig().configure_ipu_system()
    for a, b in zip(plain, recomputed):
        np.testing.assert_array_equal(a, b)
