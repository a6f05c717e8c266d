"""A program placed on two IPUs (compiler/placement.py) as every profile view
shows it: the report's memory and cycles per IPU, one memory picture per
IPU, the summary naming the IPUs, and TensorBoard's XSpace with a plane
and an allocator per IPU whose numbers are the report's."""

import glob
import os

import numpy as np
import pytest

from keras_ipu.backend import tensorboard as tb
from keras_ipu.device.compiler import CompileOptions
from keras_ipu.device.jit import jit
from keras_ipu.device.simulator import profile
from keras_ipu.report import summary
from keras_ipu.report import xspace

import two_ipu_step


@pytest.fixture(scope="module")
def placed():
    model = two_ipu_step.model(hidden=64)
    step = two_ipu_step.train_step(model)
    x, y = two_ipu_step.data()
    args = ([np.asarray(w.value) for w in model.trainable_variables], x, y)
    fn = jit(step, options=CompileOptions(placement=two_ipu_step.PLACEMENT))
    fn(*args)
    (exe,) = fn.executables()
    assert exe.ipus == (0, 1)
    return fn, args, exe


def test_report_has_memory_and_cycles_per_ipu(placed):
    _, _, exe = placed
    report = profile.build_report(exe, name="placed_step")
    memory = report["memory"]
    assert [m["ipu"] for m in memory["ipus"]] == [0, 1]
    assert [t["ipu"] for t in memory["tiles"]] == [0, 1]
    for m, t in zip(memory["ipus"], memory["tiles"]):
        own = exe.memory_by_ipu[m["ipu"]]
        # One truth: each IPU's entry is the compile-time check's report.
        assert m["total"] == own.total_bytes
        assert m["fullest_tile_bytes"] == own.tile_bytes == t["fullest_tile_bytes"]
    # d0's weights (16x64) are held by IPU 0 only, d1's (64x4) by IPU 1.
    weights0 = memory["ipus"][0]["inputs"]
    weights1 = memory["ipus"][1]["inputs"]
    assert weights0 > weights1
    cycles = report["cycles"]
    assert {x["ipu"]: x["cycles"] for x in cycles["ipus"]} == {
        int(k): int(v) for k, v in exe.prediction.ipu_cycles.items()}
    assert all(x["cycles"] > 0 for x in cycles["ipus"])
    # A fused step names each of its layers once ("net/d0", not
    # "net/d0+net/d0+net/d0").
    assert any("fused" in o["op"] for o in cycles["ops"])
    for layer in cycles["layers"]:
        parts = layer["layer"].split("+")
        assert len(parts) == len(set(parts)), layer


def test_summary_and_pictures_per_ipu(placed, tmp_path):
    pytest.importorskip("matplotlib")
    from keras_ipu.report import charts

    _, _, exe = placed
    report = profile.build_report(exe, name="placed_step")
    report["_path"] = str(tmp_path / "placed.ipu_profile.json")
    text = summary.summary([report])
    fullest = max(report["memory"]["ipus"], key=lambda m: m["total"])
    assert f"IPU {fullest['ipu']}: " in text.splitlines()[2]
    assert "IPU 0:" in text and "IPU 1:" in text
    assert "cycles per run by IPU: IPU 0 " in text
    kinds = [kind for kind, *_ in charts.draw_all(report)]
    assert "memory_ipu0" in kinds and "memory_ipu1" in kinds


def test_tensorboard_xspace_has_a_plane_and_an_allocator_per_ipu(placed, tmp_path):
    fn, args, exe = placed
    tb.start_trace(str(tmp_path))
    try:
        fn(*args)
    finally:
        tb.stop_trace(save=True)
    (path,) = glob.glob(os.path.join(tmp_path, "plugins", "profile", "*", "*.xplane.pb"))
    space = xspace.read_xspace(path)
    names = [p.name for p in space.planes]
    assert "/device:CUSTOM:IPU:0 (predicted)" in names
    assert "/device:CUSTOM:IPU:1 (predicted)" in names
    for ipu in (0, 1):
        plane = next(p for p in space.planes if p.name == f"/device:CUSTOM:IPU:{ipu} (predicted)")
        steps = next(x for x in plane.lines if x.name == "Program steps")
        assert len(steps.events) > 0
    host = next(p for p in space.planes if p.name == "/host:CPU")
    stat_names = {k: m.name for k, m in host.stat_metadata.items()}
    for ipu in (0, 1):
        line = next(x for x in host.lines
                    if x.name == f"IPU {ipu} memory activity (predicted)")
        peaks = [s.int64_value for e in line.events for s in e.stats
                 if stat_names[s.metadata_id] == "peak_bytes_in_use"]
        assert max(peaks) == exe.memory_by_ipu[ipu].total_bytes
