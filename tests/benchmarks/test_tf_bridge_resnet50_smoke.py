"""Smoke test of benchmarks/tf_bridge_resnet50.py on its tiny model: both
subprocesses run and the report has its fields. Speed is never asserted."""

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "tf_bridge_resnet50.py"


def test_tiny_run_writes_report(tmp_path):
    out = tmp_path / "report.json"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--model", "tiny", "--image-size", "32", "--batch", "2",
         "--steps", "1", "--profile", "--out", str(out)],
        capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["config"] == {"model": "tiny", "image_size": 32, "batch": 2, "steps": 1}
    tf_ = report["tensorflow"]
    for field in ("tf_trace_s", "tf_xla_first_call_s", "tf_xla_step_s", "bridge_tf_trace_s",
                  "bridge_hlo_s", "bridge_import_s", "bridge_compile_s", "bridge_step_s",
                  "bridge_step_cpu_s"):
        assert tf_[field] > 0, field
    assert tf_["hlo_instructions"] > tf_["imported_nodes"] > 0
    assert report["ipu"]["ipu_step_s"] > 0 and report["ipu"]["ipu_step_cpu_s"] > 0
    assert report["bridge_step_over_ipu_step"] > 0
    assert report["bridge_step_cpu_over_ipu_step_cpu"] > 0
    assert any("bridged / ipu" in line for line in report["summary"])
    # --profile: the call path's phases and the step program's kernels.
    bridged, ipu = tf_["profile"], report["ipu"]["profile"]
    assert {"variable read", "executable run", "variable write-back"} <= set(bridged["phases_ms"])
    assert "executable run" in ipu["phases_ms"]
    # The ipu step's kernels are its device loop body's, not the loop.
    assert "scan" not in ipu["kernels"] and "conv_general_dilated" in ipu["kernels"]
    assert bridged["kernels"]["conv_general_dilated"]["count"] == 2
    assert ipu["kernels"]["conv_general_dilated"]["count"] == 2
