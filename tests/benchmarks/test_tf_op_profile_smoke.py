"""Smoke test of benchmarks/tf_op_profile.py: the tiny CNN on the ipu
backend's TensorFlow engine runs under TensorFlow's profiler and the table
names the kernels TensorFlow ran, the max-pool gradient as MaxPoolGrad
(select_and_scatter_add's rule). No speed is asserted."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("tensorflow")

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "tf_op_profile.py"


def test_quick_cnn_profile_on_the_tensorflow_engine():
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--model", "cnn", "--backend", "ipu",
         "--steps", "2", "--top", "100"],
        capture_output=True, text=True, timeout=600, env=dict(os.environ),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = re.findall(r"^\| (\S+) \| ([\d.]+) \| [\d.]+ \| [\d.]+% \|$", proc.stdout, re.M)
    ops = {op: float(n) for op, n in rows}
    # Two max pools: one gradient kernel each (oneDNN's or TensorFlow's own
    # name), none of the per-tap decomposition's zero pads and tie masks.
    assert sum(n for op, n in ops.items() if op.endswith("MaxPoolGrad")) == 2, ops
    assert not {"PadV2", "LogicalAnd", "LogicalOr"} & set(ops), ops
    assert "kernels and" in proc.stdout and "process CPU" in proc.stdout
