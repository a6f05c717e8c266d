"""examples/tensorflow_on_ipu.py runs under KERAS_BACKEND=tensorflow and
prints what it promises."""

import os
import re
import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).parents[3] / "examples" / "tensorflow_on_ipu.py"


def test_tensorflow_on_ipu_example():
    env = dict(os.environ, KERAS_BACKEND="tensorflow", TF_CPP_MIN_LOG_LEVEL="3")
    proc = subprocess.run([sys.executable, str(EXAMPLE)], env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = proc.stdout
    assert "backend: tensorflow" in out
    first, last = map(float, re.search(r"training loss: ([\d.]+) -> ([\d.]+)", out).groups())
    assert "48 steps in 6 programs" in out and last < first
    accuracy = float(re.search(r"fit: loss=[\d.]+ accuracy=([\d.]+)", out).group(1))
    assert accuracy >= 0.9
    assert re.search(r"program: [\d.]+ MiB on the IPU", out)
