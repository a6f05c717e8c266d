"""Keras' own ways of choosing a backend select "ipu": KERAS_BACKEND,
keras.json under KERAS_HOME or ~/.keras, keras.config.set_backend."""

import json
import os
import subprocess
import sys
import textwrap

import pytest


def _run(code, env_changes, tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("KERAS_BACKEND", "KERAS_HOME")}
    env.update(env_changes)
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], env=env,
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stdout.split()


def _keras_json(directory, backend):
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "keras.json").write_text(json.dumps({
        "floatx": "float32", "epsilon": 1e-07, "backend": backend,
        "image_data_format": "channels_last",
    }))


_FIT_AND_SWITCH = """
    import numpy as np
    import keras
    print(keras.backend.backend(), type(keras.ops.add(1, 2)).__module__)
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    model.fit(np.ones((4, 2)), np.ones((4, 1)), verbose=0)
    keras.config.set_backend("numpy")
    import keras
    print(keras.backend.backend())
    keras.config.set_backend("ipu")
    import keras
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    model.fit(np.ones((4, 2)), np.ones((4, 1)), verbose=0)
    print(keras.backend.backend(), type(keras.ops.add(1, 2)).__module__)
"""


def test_keras_json_in_keras_home_selects_ipu(tmp_path):
    _keras_json(tmp_path / "home", "ipu")
    out = _run(_FIT_AND_SWITCH, {"KERAS_HOME": str(tmp_path / "home")}, tmp_path)
    assert out == ["ipu", "keras_ipu.device.array", "numpy", "ipu", "keras_ipu.device.array"]


def test_keras_json_in_the_home_directory_selects_ipu(tmp_path):
    _keras_json(tmp_path / "user" / ".keras", "ipu")
    code = "import keras; print(keras.backend.backend(), keras.ops.add(1, 2))"
    env = {"HOME": str(tmp_path / "user"), "KERAS_BACKEND": ""}  # empty: keras.json
    assert _run(code, env, tmp_path) == ["ipu", "3"]


def test_keras_backend_overrides_keras_json(tmp_path):
    _keras_json(tmp_path / "home", "ipu")
    code = "import keras; print(keras.backend.backend())"
    env = {"KERAS_HOME": str(tmp_path / "home"), "KERAS_BACKEND": "numpy"}
    assert _run(code, env, tmp_path) == ["numpy"]
