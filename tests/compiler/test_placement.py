"""The placement pass (compiler/placement.py) on compiled programs: a
Keras training step split over two pipeline stages, a device loop around
it, per-IPU memory and cycles of the Executable."""

import keras
import numpy as np
import pytest

from keras_ipu.device import autodiff
from keras_ipu.device.compiler import CompileOptions
from keras_ipu.device.compiler.placement import Placement
from keras_ipu.device.jit import jit
from keras_ipu.device.simulator import memory_model
from keras_ipu.device.simulator.sharding import predict_sharded

from two_ipu_step import PLACEMENT
from two_ipu_step import data as _data
from two_ipu_step import model as _model
from two_ipu_step import train_step as _train_step

def _maker(graph, var):
    return next(node for node in graph.nodes if var in node.outputs)


def test_a_training_step_runs_where_its_layers_are():
    model = _model()
    weights = [np.asarray(w.value) for w in model.trainable_variables]
    x, y = _data()
    plain = jit(_train_step(model))
    placed = jit(_train_step(model),
                 options=CompileOptions(placement=PLACEMENT, fuse_elementwise=False))
    want, got = plain(weights, x, y), placed(weights, x, y)
    # Unfused against fused kernels: equal within rounding, which on
    # weights near zero needs an absolute bound too.
    np.testing.assert_allclose(got[0], want[0], rtol=1e-6)
    for a, b in zip(got[1], want[1]):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-8)

    exe = placed.executable(weights, x, y)
    graph = exe.graph
    assert exe.ipus == (0, 1)
    for node in graph.nodes:
        assert node.stage in (0, 1) and node.ipu == node.stage
        if node.source and node.source.startswith("net/d0"):
            assert node.stage == 0  # forward and backward of d0
        if node.source and node.source.startswith("net/d1"):
            assert node.stage == 1
    # The loss (no layer path) runs on the last stage; each weight's update
    # (no layer path either) where its layer is.
    loss, *new_weights = graph.outputs
    assert _maker(graph, loss).stage == 1
    assert [_maker(graph, w).stage for w in new_weights] == [0, 0, 1, 1]
    # Activations cross forward, gradients back, each once per IPU.
    copies = [(n.params["src"], n.params["dst"]) for n in graph.nodes
              if n.primitive.name == "ipu_copy"]
    assert (0, 1) in copies and (1, 0) in copies
    assert len(copies) == len({(n.inputs[0], n.params["dst"]) for n in graph.nodes
                               if n.primitive.name == "ipu_copy"})


def test_the_executable_reports_memory_and_cycles_per_ipu():
    model = _model()
    weights = [np.asarray(w.value) for w in model.trainable_variables]
    x, y = _data()
    exe = jit(_train_step(model), options=CompileOptions(placement=PLACEMENT)
              ).executable(weights, x, y)
    assert sorted(exe.memory_by_ipu) == [0, 1]
    m0, m1 = exe.memory_by_ipu[0], exe.memory_by_ipu[1]
    # Each IPU holds its own layer's weights (and the batch it reads).
    assert m0.input_bytes == (16 * 32 + 32 + 8 * 16) * 4
    assert m1.input_bytes == (32 * 4 + 4 + 8 * 4) * 4
    assert exe.memory in (m0, m1) and exe.memory.tile_bytes == max(m0.tile_bytes,
                                                                     m1.tile_bytes)
    pred = exe.prediction
    assert set(pred.ipu_cycles) == {0, 1}
    assert sum(pred.ipu_cycles.values()) == pred.cycles
    # A one-IPU program: everything on IPU 0, as before placement existed.
    single = jit(_train_step(model)).executable(weights, x, y)
    assert single.ipus == (0,) and single.prediction.ipu_cycles == {0: single.prediction.cycles}
    assert single.memory.input_bytes == (16 * 32 + 32 + 32 * 4 + 4 + 8 * 16 + 8 * 4) * 4


def test_the_profile_report_shows_each_ipu():
    from keras_ipu.device.simulator import profile
    from keras_ipu.report import timeline
    from keras_ipu.report import xspace

    model = _model()
    weights = [np.asarray(w.value) for w in model.trainable_variables]
    x, y = _data()
    exe = jit(_train_step(model), options=CompileOptions(placement=PLACEMENT)
              ).executable(weights, x, y)
    report = profile.build_report(exe)
    memory, live = report["memory"], report["liveness"]
    assert [m["ipu"] for m in memory["ipus"]] == [0, 1]
    assert [t["ipu"] for t in memory["tiles"]] == [0, 1]
    for entry, tiles in zip(memory["ipus"], memory["tiles"]):
        mem = exe.memory_by_ipu[entry["ipu"]]
        assert entry["inputs"] == mem.input_bytes
        assert entry["not_always_live"] == mem.not_always_live_bytes
        # The per-tile picture's fullest tile is the memory report's.
        assert tiles["fullest_tile_bytes"] == mem.tile_bytes
        # Each IPU's step curve peaks at its report's not-always-live bytes.
        per_step, _, _ = profile.liveness(exe, exe.target, entry["ipu"])
        assert max(per_step) == mem.not_always_live_bytes
    assert live["ipu"] == exe.memory.ipu
    assert max(live["not_always_live"]) == exe.memory.not_always_live_bytes
    # The trace's memory counters and the XSpace planes: one per IPU.
    runs = [(exe, 0.0, 1e-3)]
    _, counters = timeline.lay_out(runs, 0.0)
    assert {c.ipu for c in counters} == {0, 1}
    pytest.importorskip("tensorflow")  # the XSpace protos are TensorFlow's
    space = xspace.build_xspace("host", 0.0, 0.0, [], runs)
    names = [p.name for p in space.planes]
    assert xspace.IPU_PLANE.format(ipu=0) in names and xspace.IPU_PLANE.format(ipu=1) in names
    host = space.planes[0]
    lines = {line.name: line for line in host.lines}
    for ipu in (0, 1):
        # Each IPU's memory activity allocates what that IPU holds.
        line = lines[f"IPU {ipu} memory activity (predicted)"]
        assert len(line.events) > 0


def test_a_device_loop_around_the_placed_step():
    model = _model()
    weights = [np.asarray(w.value) for w in model.trainable_variables]
    x, y = _data()
    step = _train_step(model)

    def loop(weights, xs, ys):
        def body(ws, batch):
            loss, new = step(ws, *batch)
            return new, loss

        return keras.ops.scan(body, weights, (xs, ys))

    xs, ys = np.stack([x] * 3), np.stack([y] * 3)
    placed = jit(loop, options=CompileOptions(placement=PLACEMENT))
    want = jit(loop)(weights, xs, ys)
    got = placed(weights, xs, ys)
    for a, b in zip(got[0], want[0]):
        np.testing.assert_allclose(a, b, rtol=1e-5)
    exe = placed.executable(weights, xs, ys)
    (scan,) = [n for n in exe.graph.nodes if n.primitive.name == "scan"]
    assert scan.stage is None and scan.ipu is None  # it spans both IPUs
    assert exe.ipus == (0, 1)
    # The weights each stay on the IPU of their layer.
    read0 = memory_model.reads_on(exe.graph, 0)
    assert [v in read0 for v in exe.graph.inputs[:4]] == [True, True, False, False]
    # The schedule reads the loop's body: one micro-batch, run 3 times (the
    # loop's micro-batches, which a step of 4 would not divide).
    pipe = predict_sharded(exe, gradient_accumulation_count=3)
    assert pipe.steps_per_run == 1 and pipe.gradient_accumulation_count == 3
    with pytest.raises(ValueError, match="runs 3 micro-batches, not a multiple"):
        predict_sharded(exe, gradient_accumulation_count=4)
    assert [p.ipu for p in pipe.ipus] == [0, 1]
    assert all(p.forward_cycles > 0 and p.backward_cycles >= 0 for p in pipe.ipus)
    assert pipe.ipus[0].backward_cycles > 0  # d0's backward comes back to IPU 0


def test_stages_recorded_by_the_trace_follow_each_invocation():
    # One layer called on two stages (shared weights): each call's nodes,
    # forward and backward, run where the call was made.
    from keras_ipu.device.trace import stage_scope

    dense = keras.layers.Dense(8, name="shared")
    dense.build((None, 8))
    weights = [np.asarray(w.value) for w in dense.trainable_variables]

    def loss_of(ws, x):
        with stage_scope(0):
            h, _ = dense.stateless_call(ws, [], x)
        with stage_scope(1):
            y, _ = dense.stateless_call(ws, [], keras.ops.tanh(h))
        return keras.ops.sum(y)

    def step(ws, x):
        return autodiff.grad(loss_of)(ws, x)

    x = np.ones((4, 8), np.float32)
    exe = jit(step, options=CompileOptions(placement=Placement.of({}, (0, 1)),
                                           fuse_elementwise=False)).executable(weights, x)
    dots = [n for n in exe.graph.nodes if n.primitive.name == "dot_general"]
    assert {n.stage for n in dots} == {0, 1}  # two calls, backward too
    assert all(n.ipu == n.stage for n in exe.graph.nodes)
    # The kernel's gradient sums both calls' contributions: a copy joins them.
    assert any(n.primitive.name == "ipu_copy" and n.params["dst"] == 0
               for n in exe.graph.nodes)
    with pytest.raises(ValueError, match="Stage 1 has no IPU"):
        jit(step, options=CompileOptions(placement=Placement.of({}, (0,)))).executable(
            weights, x)


def test_bad_placements_name_the_value_and_the_fix():
    with pytest.raises(ValueError, match="maps Keras layer paths"):
        Placement.of([0, 1])
    with pytest.raises(ValueError, match="Stage 2 has no IPU"):
        Placement.of({"a": 0, "b": 2}, device_mapping=(0, 1))
    with pytest.raises(ValueError, match="is not a layer path"):
        Placement.of({3: 0})
