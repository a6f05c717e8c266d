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
