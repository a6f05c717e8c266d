"""Smoke test of benchmarks/multiprocess_scaling.py: it launches the
measured jobs, predicts the scaling and writes its report. Speed is never
asserted (a shared machine says nothing reliable about it)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mpi4py")

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "multiprocess_scaling.py"


def test_quick_run_writes_report(tmp_path):
    out = tmp_path / "report.json"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--processes", "1,2", "--out", str(out)],
        capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL,
        env={**os.environ, "KERAS_BACKEND": "ipu"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "overhead, not speed-up" in done.stdout
    report = json.loads(out.read_text())
    assert sorted(report["measured_seconds_per_step"]) == ["1", "2"]
    assert sorted(report["predicted"]) == ["1", "8"]
    rows = report["predicted"]["1"]
    assert [r["ipus"] for r in rows] == [1, 4, 16, 64]
    assert rows[0]["reduction_seconds"] == 0.0 and rows[0]["efficiency"] == 1.0
    for r in rows[1:]:
        assert r["reduction_seconds"] > 0 and 0 < r["efficiency"] < 1
