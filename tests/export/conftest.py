"""The fixture the export tests share: serving a SavedModel in a fresh
TensorFlow process that never imports keras_ipu."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

_SCRIPT = Path(__file__).parent / "serve_saved_model.py"


@pytest.fixture
def serve_in_fresh_tensorflow(tmp_path):
    """serve(path, arrays, endpoint) -> the endpoint's outputs (a dict of
    arrays, or an array) computed by a new Python process running plain
    TensorFlow; fails the test if that process loaded keras_ipu."""

    def serve(path, arrays, endpoint="serve"):
        inputs = tmp_path / "fresh_inputs.npz"
        np.savez(inputs, *arrays)
        env = dict(os.environ, KERAS_IPU_TF_HOOK="0", TF_CPP_MIN_LOG_LEVEL="3")
        env.pop("KERAS_BACKEND", None)
        done = subprocess.run(
            [sys.executable, str(_SCRIPT), str(path), str(inputs), endpoint],
            env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        result = json.loads(done.stdout.strip().splitlines()[-1])
        # keras_ipu (its backend, its device) is not needed to serve it.
        assert result["modules"] == []
        out = result["out"]
        if isinstance(out, dict):
            return {k: np.asarray(v) for k, v in out.items()}
        return np.asarray(out)

    return serve
