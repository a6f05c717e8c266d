"""Smoke test of benchmarks/split_timing.py: it runs a short fit of the MLP
at two threads and prints one row per split product, each with its ten
columns. Speed is never asserted here."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from keras_ipu.device.native import product_pool

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "split_timing.py"


@pytest.mark.skipif(not product_pool.available(), reason="no C pool")
def test_split_timing_table():
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--epochs", "1"],
        capture_output=True, text=True, timeout=900,
        env={**os.environ, "KERAS_BACKEND": "ipu"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("mlp, batch 128, sgd, 2 threads:"), lines[0]
    rows = [line for line in lines[3:] if line.startswith("| (")]
    # The MLP's products split in two row blocks where the pool is not
    # backing off (a busy machine may keep every one whole: no row); on
    # OpenBLAS' SkylakeX kernels, whose rule splits columns anywhere, the
    # 128-row products split in two column blocks (axis 1) instead.
    assert all(line.count("|") == 11 for line in rows), rows
    assert all("rows, first" in line or "| 2 blocks, axis 1 |" in line for line in rows), rows
