"""Smoke test of benchmarks/step_profile.py: it runs end to end on the tiny
model and its per-kernel table adds up to its total. No speed is asserted."""

import json
import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "step_profile.py"


def test_quick_step_profile(tmp_path):
    out = tmp_path / "profile.json"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--repeats", "2", "--out", str(out)],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "KERAS_BACKEND": "ipu"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    rows = report["rows"]
    names = {r["kernel"].split()[0] for r in rows}
    # demo_functional's step: products, the fused optimizer update, sums.
    assert {"dot_general", "fused_elementwise"} <= names, names
    assert all(r["per_step"] >= 1 and r["ms_per_step"] >= 0 for r in rows)
    assert abs(sum(r["ms_per_step"] for r in rows) - report["kernels_ms_per_step"]) < 1e-9
    assert "ms CPU per step" in proc.stdout
    assert report["clock"] == "thread"
