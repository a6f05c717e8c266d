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


_TF1_SCRIPT = Path(__file__).parent / "run_tf1_saved_model.py"


@pytest.fixture(scope="module")
def run_tf1_in_fresh_tensorflow(tmp_path_factory):
    """run(jobs) with jobs [(SavedModel path, tag, signature, {input name:
    array}, runs[, "tf2": TensorFlow 2's loader])] -> per job {"runs": the signature's outputs of each run,
    "variables": the global variables after the runs (each with the
    graph's train op), "train_op": bool}, computed by one new Python
    process running plain TensorFlow's TF1 SavedModel loader; fails the
    test if that process loaded keras_ipu."""

    def run(jobs):
        tmp_path = tmp_path_factory.mktemp("tf1_jobs")
        described = []
        for k, (path, tag, signature, inputs, runs, *loader) in enumerate(jobs):
            arrays = tmp_path / f"tf1_inputs_{k}.npz"
            np.savez(arrays, **inputs)
            described.append({"path": str(path), "tag": tag, "signature": signature,
                              "inputs": str(arrays), "runs": runs,
                              "loader": loader[0] if loader else "tf1"})
        jobs_file = tmp_path / "tf1_jobs.json"
        jobs_file.write_text(json.dumps(described))
        env = dict(os.environ, KERAS_IPU_TF_HOOK="0", TF_CPP_MIN_LOG_LEVEL="3")
        env.pop("KERAS_BACKEND", None)
        done = subprocess.run([sys.executable, str(_TF1_SCRIPT), str(jobs_file)],
                              env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        result = json.loads(done.stdout.strip().splitlines()[-1])
        assert result["modules"] == []
        return [{"runs": [{k: np.asarray(v) for k, v in out.items()} for out in job["runs"]],
                 "variables": {k: np.asarray(v) for k, v in job["variables"].items()},
                 "train_op": job["train_op"]} for job in result["results"]]

    return run
