"""The examples run and print what they promise."""

import os
import re
import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).parents[2] / "examples"


def run_example(name, backend="ipu", **env_vars):
    env = dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="3", **env_vars)
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / name)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stdout


def test_predict_on_ipu_classifies_the_stripes():
    out = run_example("predict_on_ipu.py")
    assert "backend: ipu" in out
    assert "predict accuracy: 1.000" in out
    loss, accuracy = re.search(
        r"evaluate: loss=([\d.]+) accuracy=([\d.]+)", out
    ).groups()
    assert float(accuracy) == 1.0
    assert 0.0 < float(loss) < 0.5


def test_train_on_ipu_learns_the_stripes():
    out = run_example("train_on_ipu.py")
    assert "backend: ipu" in out
    first, last = map(
        float, re.search(r"training loss: ([\d.]+) -> ([\d.]+)", out).groups()
    )
    assert last < first / 10, out[-2000:]
    accuracy = float(re.search(r"test: loss=[\d.e-]+ accuracy=([\d.]+)", out).group(1))
    assert accuracy >= 0.95, out[-2000:]


def test_train_on_ipu_without_the_profile_extra(tmp_path):
    # The README's first command installs no [profile] extra: the example
    # must still finish, with the report's summary and no pictures.
    blocker = tmp_path / "matplotlib"
    blocker.mkdir()
    (blocker / "__init__.py").write_text("raise ImportError('no matplotlib here')\n")
    out = run_example(
        "train_on_ipu.py",
        PYTHONPATH=os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])),
    )
    assert "Predicted for a real IPU" in out
    assert "pictures need matplotlib" in out
    assert "Wrote" not in out
