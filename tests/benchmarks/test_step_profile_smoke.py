"""Smoke test of benchmarks/step_profile.py: it runs end to end on the tiny
model and its per-kernel table adds up to its total. No speed is asserted."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "step_profile.py"


def test_quick_step_profile(tmp_path):
    out = tmp_path / "profile.json"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--repeats", "2", "--out", str(out)],
        capture_output=True, text=True, timeout=900,
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


def test_quick_layers_table():
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--layers", "--repeats", "30"],
        capture_output=True, text=True, timeout=900,
        env={**os.environ, "KERAS_BACKEND": "ipu"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [line.split("|")[1].strip() for line in proc.stdout.splitlines()
            if line.startswith("| ") and not line.startswith("| layer")]
    assert rows == ["step program (run loop)", "device loop program",
                    "train function, state held", "train function, state written",
                    "fit epoch", "fit epoch, programs not run"]
    table = [line.split("|")[2:8] for line in proc.stdout.splitlines()
             if line.startswith("| ") and not line.startswith("| layer")]
    # wall, min, process CPU, main thread CPU, main thread waiting, of which
    # for a core (ms per step)
    assert all(len(row) == 6 and all(float(v) == float(v) for v in row[:5]) for row in table)
    # Without its programs a fit epoch costs less CPU than with them.
    assert float(table[5][2]) < float(table[4][2])
    for row in table:
        if row[5].strip() != "-":
            # Runnable without a core: never longer than the round took
            # (each round's wait is at most its wall time, so their medians
            # are too), in ms as the other columns.
            assert 0 <= float(row[5]) <= float(row[0]) + 0.005, row


def test_run_queue_seconds_counts_up_in_seconds():
    import importlib.util
    import time

    spec = importlib.util.spec_from_file_location("step_profile", SCRIPT)
    step_profile = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(step_profile)
    before, start = step_profile.run_queue_seconds(), time.perf_counter()
    if before is None:
        pytest.skip("no /proc/thread-self/schedstat here")
    while time.perf_counter() - start < 0.05:
        pass
    after = step_profile.run_queue_seconds()
    # This thread cannot have waited for a core longer than the time that passed.
    assert 0 <= after - before <= time.perf_counter() - start


def test_run_loop_times_both_orders_and_checks_their_bits(monkeypatch):
    import importlib.util

    import numpy as np

    from keras_ipu.device.compiler import compile_graph
    from keras_ipu.device.ir import Graph
    from keras_ipu.device.ir import Node
    from keras_ipu.device.ir import ShapedArray
    from keras_ipu.device.ir import Var
    from keras_ipu.device.native import threads
    from keras_ipu.device.primitives import REGISTRY

    spec = importlib.util.spec_from_file_location("step_profile", SCRIPT)
    step_profile = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(step_profile)
    monkeypatch.setattr(threads, "_cap", 2)
    # Products of 17 MFLOP stay on one thread (and are launched) at the Python
    # pool's threshold; the C pool's (threads.py) would split them instead.
    monkeypatch.setattr(threads, "NATIVE_FLOPS_PER_THREAD", threads.FLOPS_PER_THREAD)
    # A Dense layer's two gradients at batch 32 (g @ w^T launched beside x^T @ g).
    x, w, g = (Var(ShapedArray(s, "float32")) for s in ((32, 512), (512, 512), (32, 512)))
    dot = REGISTRY["dot_general"]
    dims = ((((1,), (1,)), ((), ())), (((0,), (0,)), ((), ())))
    outs = [Var(ShapedArray(s, "float32")) for s in ((32, 512), (512, 512))]
    graph = Graph()
    graph.inputs = [x, w, g]
    graph.nodes = [Node(dot, [g, w], {"dimension_numbers": dims[0]}, [outs[0]]),
                   Node(dot, [x, g], {"dimension_numbers": dims[1]}, [outs[1]])]
    graph.outputs = outs
    step = compile_graph(graph)
    assert any(getattr(k, "launched", None) for k, *_ in step._run_program)
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal(v.aval.shape).astype(np.float32) for v in graph.inputs]
    times = step_profile.run_loop_times(step, inputs, 3)
    assert set(times) == {"program order", "run loop", "run loop, stepped"}
    assert all(len(walls) == 3 and cpu >= 0 for walls, cpu in times.values())
    # A run loop giving other values is reported.
    kernel, ins, out, multi, frees = step._program[1]
    broken = (lambda *xs: kernel(*xs) + 1, ins, out, multi, frees)
    step._run_program = (step._program[0], broken)
    with pytest.raises(AssertionError, match="differ"):
        step_profile.run_loop_times(step, inputs, 1)
