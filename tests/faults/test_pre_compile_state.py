"""device_connection.type = PRE_COMPILE compiles (and caches) fit/evaluate/
predict's programs without running them: their outputs are zeros, and no
variable or optimizer slot may take those zeros as its new value."""

import os

import keras
import numpy as np
import pytest

from keras_ipu.config import DeviceConnectionType
from keras_ipu.config import IPUConfig
from keras_ipu.config import configure_ipu_system
from keras_ipu.config import reset_ipu_configuration


def _model():
    keras.utils.set_random_seed(5)
    model = keras.Sequential([
        keras.Input((6,)),
        keras.layers.Dense(8, activation="relu", bias_initializer="ones"),
        keras.layers.BatchNormalization(),
        keras.layers.Dense(3),
    ])
    model.compile(keras.optimizers.Adam(0.01), "mse", metrics=["mae"],
                  steps_per_execution=2)
    return model


def _data():
    rng = np.random.default_rng(1)
    return rng.random((32, 6), dtype=np.float32), rng.random((32, 3), dtype=np.float32)


def _state(model):
    variables = model.variables + model.optimizer.variables
    return {v.path: np.array(v) for v in variables}


def _pre_compile(monkeypatch, cache):
    monkeypatch.setenv("TF_POPLAR_FLAGS", f"--executable_cache_path={cache}")
    config = IPUConfig()
    config.device_connection.type = DeviceConnectionType.PRE_COMPILE
    config.device_connection.version = "ipu2"
    configure_ipu_system(config)


@pytest.mark.parametrize("loop", ["fit", "evaluate", "predict"])
def test_pre_compile_leaves_every_variable_as_it_was(monkeypatch, tmp_path, loop):
    x, y = _data()
    model = _model()
    model.fit(x, y, batch_size=8, verbose=0)  # the optimizer slots exist, nonzero
    before = _state(model)
    _pre_compile(monkeypatch, tmp_path)
    if loop == "fit":
        model.fit(x, y, batch_size=8, epochs=2, verbose=0)
    elif loop == "evaluate":
        model.evaluate(x, y, batch_size=8, verbose=0)
    else:
        out = model.predict(x, batch_size=8, verbose=0)
        assert not out.any()  # PRE_COMPILE's documented zeros
    assert [f for f in os.listdir(tmp_path) if not f.startswith(".")]  # cached
    after = _state(model)
    for path, value in before.items():
        np.testing.assert_array_equal(after[path], value, err_msg=path)

    # Back on a device, the model carries on from where it was.
    reset_ipu_configuration()
    monkeypatch.delenv("TF_POPLAR_FLAGS")
    reference = _model()
    reference.fit(x, y, batch_size=8, verbose=0)
    np.testing.assert_allclose(
        model.predict(x, verbose=0), reference.predict(x, verbose=0), rtol=1e-6
    )


def test_pre_compile_strategy_run_of_keras_code_leaves_its_variables(monkeypatch, tmp_path):
    """IPUStrategy.run of a step that assigns a Keras variable: compiled
    and cached, the variable keeps its value (not the zeros of the run)."""
    from keras_ipu.ipu_strategy import IPUStrategy

    _pre_compile(monkeypatch, tmp_path)
    strategy = IPUStrategy()
    with strategy.scope():
        v = keras.Variable(np.ones(3, np.float32))

        def step():
            v.assign(v + 1.0)
            return v.value

        out = strategy.run(step)
    assert not np.asarray(out).any()
    assert [f for f in os.listdir(tmp_path) if not f.startswith(".")]
    np.testing.assert_array_equal(np.array(v), np.ones(3, np.float32))


def test_pre_compile_tensorflow_function_leaves_its_variables(monkeypatch, tmp_path):
    """The TensorFlow front end: a tf.function that updates a tf.Variable,
    run under PRE_COMPILE, leaves the variable as it was."""
    tf = pytest.importorskip("tensorflow")
    from keras_ipu.frontends.tensorflow.function import BridgedFunction

    w = tf.Variable(np.full(4, 2.0, np.float32))

    @tf.function(jit_compile=True)
    def step(x):
        w.assign_add(x)
        return w * 1.0

    _pre_compile(monkeypatch, tmp_path)
    out = BridgedFunction(step)(tf.constant(np.ones(4, np.float32)))
    assert not np.asarray(out).any()
    np.testing.assert_array_equal(w.numpy(), np.full(4, 2.0, np.float32))
