"""Sharding and pipelining: the placement pass (compiler/placement.py) and
the schedule read from a placed program (simulator/sharding.py), checked
against hand computations on small hand-built graphs (ipu2: 1472 tiles,
1.33 GHz, IPU-Links 320 GB/s)."""

import math

import numpy as np
import pytest

from keras_ipu.device.compiler.placement import Placement
from keras_ipu.device.compiler.placement import place
from keras_ipu.device.interpreter import eval_graph
from keras_ipu.device.simulator import cost_model as cm
from keras_ipu.device.simulator import memory_model
from keras_ipu.device.simulator.prediction import predict_costs
from keras_ipu.device.simulator.sharding import in_flight
from keras_ipu.device.simulator.sharding import predict_sharded
from keras_ipu.device.simulator.targets import TARGETS

from compiler_graphs import aval
from compiler_graphs import build

IPU2 = TARGETS["ipu2"]
MM = (((1,), (0,)), ((), ()))
MM_T = (((1,), (1,)), ((), ()))  # x @ w.T


def two_stage_forward():
    # x f32[64,32] -> dense1 (stage 0) -> tanh -> dense2 (stage 1)
    def body(b, x, w1, w2):
        h = b.op("dot_general", x, w1, dimension_numbers=MM, source="model/dense1")
        a = b.op("tanh", h, source="model/dense1/activation")
        return b.op("dot_general", a, w2, dimension_numbers=MM, source="model/dense2")

    return build([aval((64, 32)), aval((32, 128)), aval((128, 16))], body)


def two_stage_training():
    # Forward on stage 0 then 1, a stand-in backward on 1 then 0: the
    # backward of stage 0 reads its forward activation `a` (stashed).
    def body(b, x, w1, w2):
        h = b.op("dot_general", x, w1, dimension_numbers=MM, source="m/s0")
        a = b.op("tanh", h, source="m/s0")
        o = b.op("dot_general", a, w2, dimension_numbers=MM, source="m/s1")
        go = b.op("mul", o, o, source="m/s1")
        ga = b.op("dot_general", go, w2, dimension_numbers=MM_T, source="m/s1")
        return b.op("mul", ga, a, source="m/s0")

    return build([aval((64, 32)), aval((32, 128)), aval((128, 16))], body)


LINK_CYCLES_32K = math.ceil(32768 / 320e9 * 1.33e9) + cm.INTER_IPU_SYNC_CYCLES


def placed(graph, assignment, device_mapping=None):
    return place(graph, Placement.of(assignment, device_mapping))


def stages(graph):
    return [n.stage for n in graph.nodes]


def names(graph):
    return [n.primitive.name for n in graph.nodes]


def test_ipu_link_cycles_by_hand():
    # 32 KiB over 320 GB/s at 1.33 GHz: 136.2 -> 137 cycles, + the global sync.
    assert cm.ipu_link_cycles(32768, IPU2) == 137 + 900 == LINK_CYCLES_32K
    assert cm.ipu_link_cycles(0, IPU2) == 0
    assert cm.pipeline_utilisation(4, 2) == pytest.approx(4 / 5)
    assert cm.pipeline_utilisation(16, 4) == pytest.approx(16 / 19)


def test_stages_from_layer_path_prefixes():
    g = two_stage_forward()
    two = placed(g, {"model/dense1": 0, "model/dense2": 1})
    # The copy of tanh's output to IPU 1 runs before its reader there.
    assert names(two) == ["dot_general", "tanh", "ipu_copy", "dot_general"]
    assert stages(two) == [0, 0, 1, 1] and [n.ipu for n in two.nodes] == [0, 0, 1, 1]
    # The longest path wins; a path is a whole segment (dense1 is not dense10).
    assert stages(placed(g, {"model": 0, "model/dense2": 1})) == [0, 0, 1, 1]
    assert stages(placed(g, {"model/dense": 1, "model": 0})) == [0, 0, 0]
    with pytest.raises(ValueError, match="No node of the program runs in a layer"):
        placed(g, {"other": 0})
    with pytest.raises(ValueError, match="non-negative int"):
        Placement.of({"model": -1})


def test_unplaced_nodes_follow_their_operands_or_weights():
    def body(b, x, w1, w2):
        h = b.op("dot_general", x, w1, dimension_numbers=MM, source="m/s0")
        o = b.op("dot_general", h, w2, dimension_numbers=MM, source="m/s1")
        loss = b.op("mul", o, o)  # no layer path: reads stage 1's output
        w1_new = b.op("mul", w1, w1)  # optimizer-like: reads w1, homed on 0
        return [loss, w1_new]

    g = placed(build([aval((8, 4)), aval((4, 4)), aval((4, 4))], body),
               {"m/s0": 0, "m/s1": 1})
    assert names(g) == ["dot_general", "ipu_copy", "dot_general", "mul", "mul"]
    assert stages(g) == [0, 1, 1, 1, 0]


def test_a_value_read_on_several_ipus_is_copied_once_to_each():
    def body(b, x):
        a = b.op("exp", x, source="m/s0")
        c = b.op("mul", a, a, source="m/s1")
        d = b.op("add", a, c, source="m/s1")  # reads the same copy of a
        return b.op("sub", a, d, source="m/s2")

    g = placed(build([aval((16,))], body), {"m/s0": 0, "m/s1": 1, "m/s2": 2})
    copies = [(n.params["src"], n.params["dst"]) for n in g.nodes
              if n.primitive.name == "ipu_copy"]
    assert copies == [(0, 1), (0, 2), (1, 2)]
    x = np.linspace(0, 1, 16).astype(np.float32)
    np.testing.assert_allclose(np.asarray(eval_graph(g, x)[0]), np.exp(x) - (np.exp(x) + np.exp(x) ** 2),
                               rtol=1e-6)


def test_two_stage_forward_by_hand():
    g = two_stage_forward()
    single = predict_costs(g, target=IPU2)
    c = [s.cycles for s in single.steps]
    two = placed(g, {"model/dense1": 0, "model/dense2": 1})
    p = predict_sharded(two, target=IPU2,
                        gradient_accumulation_count=4, schedule="Grouped", batch_size=64)
    assert p.stage_of_step == (0, 0, 1, 1)
    # One copy: tanh's f32[64,128] output, IPU 0 -> IPU 1.
    (copy,) = p.copies
    assert (copy.src, copy.dst, copy.nbytes, copy.step) == (0, 1, 32768, 2)
    assert copy.cycles == LINK_CYCLES_32K
    ipu0, ipu1 = p.ipus
    assert (ipu0.forward_cycles, ipu0.backward_cycles) == (c[0] + c[1], 0)
    assert (ipu1.forward_cycles, ipu1.backward_cycles) == (c[2] + LINK_CYCLES_32K, 0)
    assert ipu1.copy_in_bytes == 32768
    t0, t1 = c[0] + c[1], c[2] + LINK_CYCLES_32K
    # Grouped: (g + n - 1) slots of the slowest stage.
    assert p.step_cycles == (4 + 1) * max(t0, t1)
    assert p.utilisation == pytest.approx(4 * (t0 + t1) / (2 * p.step_cycles))
    assert p.samples_per_second == pytest.approx(64 * 4 / p.step_seconds)
    # Sequential: one IPU at a time, as a sharded model.
    seq = predict_sharded(two, target=IPU2, gradient_accumulation_count=4,
                          schedule="Sequential")
    assert seq.step_cycles == 4 * (t0 + t1)
    assert seq.step_cycles > p.step_cycles
    # Memory: each IPU holds the inputs it reads.
    m0, m1 = ipu0.memory, ipu1.memory
    assert (m0.ipu, m1.ipu) == (0, 1)
    assert m0.input_bytes == (64 * 32 + 32 * 128) * 4
    assert m1.input_bytes == 128 * 16 * 4
    # IPU 0: a = tanh h is computed in place into h (its last use): 32 KiB;
    # IPU 1: the received a and the output f32[64,16].
    assert m0.not_always_live_bytes == 32768
    assert m1.not_always_live_bytes == 32768 + 64 * 16 * 4
    assert "copy from IPU 0" in " ".join(x.made_by for x in m1.largest_live)
    assert "2 x ipu2" in str(p)


def test_one_stage_is_gradient_accumulation():
    g = two_stage_forward()
    single = predict_costs(g, target=IPU2)
    p = predict_sharded(placed(g, {"model": 0}), target=IPU2, gradient_accumulation_count=3)
    assert p.copies == [] and p.n_stages == 1
    assert p.step_cycles == 3 * single.cycles
    assert p.utilisation == pytest.approx(1.0)


def test_pipeline_schedules_change_time_and_stash():
    g = two_stage_training()
    single = predict_costs(g, target=IPU2)
    c = [s.cycles for s in single.steps]
    two = placed(g, {"m/s0": 0, "m/s1": 1})
    preds = {s: predict_sharded(two, target=IPU2, gradient_accumulation_count=8,
                                schedule=s)
             for s in ("Grouped", "Interleaved", "Sequential")}
    p = preds["Grouped"]
    # a crosses to IPU 1 for the forward pass, ga back to IPU 0.
    assert p.stage_of_step == (0, 0, 1, 1, 1, 1, 0, 0)
    # Copies: a forward (0 -> 1), ga backward (1 -> 0), 32 KiB each.
    assert [(x.src, x.dst, x.nbytes, x.phase) for x in p.copies] == [
        (0, 1, 32768, "forward"), (1, 0, 32768, "backward")]
    f0, b0 = c[0] + c[1], c[5] + LINK_CYCLES_32K
    f1 = c[2] + c[3] + c[4] + LINK_CYCLES_32K
    ipu0, ipu1 = p.ipus
    assert (ipu0.forward_cycles, ipu0.backward_cycles) == (f0, b0)
    assert (ipu1.forward_cycles, ipu1.backward_cycles) == (f1, 0)
    assert p.step_cycles == 9 * max(f0 + b0, f1)
    assert preds["Interleaved"].step_cycles == 9 * (max(f0, f1) + b0)
    assert preds["Sequential"].step_cycles == 8 * (f0 + b0 + f1)
    # Stage 0's backward reads its activation a: stashed per micro-batch in
    # flight: Grouped 2(n-1-k)+1 = 3, Interleaved n-k = 2, Sequential 1.
    assert [in_flight(s, 0, 2) for s in ("Grouped", "Interleaved", "Sequential")] == [3, 2, 1]
    assert ipu0.stash_bytes == 32768 and ipu1.stash_bytes == 0
    nal = {s: q.ipus[0].memory.not_always_live_bytes for s, q in preds.items()}
    assert nal["Grouped"] - nal["Sequential"] == 2 * 32768
    assert nal["Interleaved"] - nal["Sequential"] == 32768
    tile_a = memory_model.tile_bytes(aval((64, 128)), IPU2.tiles_per_ipu)
    tiles = {s: q.ipus[0].memory.tile_bytes for s, q in preds.items()}
    assert tiles["Grouped"] - tiles["Sequential"] == 2 * tile_a
    # The last stage stashes nothing; its memory is the same in every schedule.
    assert len({q.ipus[1].memory.not_always_live_bytes for q in preds.values()}) == 1


def test_device_mapping_and_bad_schedule():
    g = two_stage_forward()
    p = predict_sharded(placed(g, {"model/dense1": 0, "model/dense2": 1}, [3, 1]),
                        target=IPU2)
    assert [x.ipu for x in p.ipus] == [3, 1]  # in pipeline order
    assert (p.copies[0].src, p.copies[0].dst) == (3, 1)
    with pytest.raises(ValueError, match="Grouped, Interleaved, Sequential"):
        predict_sharded(placed(g, {"model": 0}), target=IPU2, schedule="Zigzag")
    with pytest.raises(ValueError, match="device_mapping"):
        placed(g, {"model/dense1": 0, "model/dense2": 1}, [0])
    with pytest.raises(ValueError, match="reads a placed program"):
        predict_sharded(g, target=IPU2)


def test_out_of_memory_names_the_ipu():
    # One tile per IPU: stage 1's weight (1 MiB) does not fit, stage 0 does.
    def body(b, x, w1, w2):
        h = b.op("dot_general", x, w1, dimension_numbers=MM, source="m/s0")
        return b.op("dot_general", h, w2, dimension_numbers=MM, source="m/s1")

    g = build([aval((8, 32)), aval((32, 16)), aval((16, 16384))], body)
    tiny = IPU2.with_tiles(1)
    two = placed(g, {"m/s0": 0, "m/s1": 1})
    p = predict_sharded(two, target=tiny)
    assert p.ipus[0].memory.fits and not p.ipus[1].memory.fits and not p.fits
    with pytest.raises(memory_model.IPUOutOfMemoryError, match="Out of memory on IPU 1"):
        predict_sharded(two, target=tiny, check_memory=True)
    assert p.ipus[1].memory.ipu == 1


def test_compiled_executable_keeps_the_layer_paths():
    from keras_ipu.device.compiler import CompileOptions
    from keras_ipu.device.compiler import compile_graph

    # Fusion off: the hand computation above holds step for step.
    g = two_stage_training()
    placement = Placement.of({"m/s0": 0, "m/s1": 1})
    exe = compile_graph(g, CompileOptions(fuse_elementwise=False, placement=placement))
    from_exe = predict_sharded(exe, target=IPU2, gradient_accumulation_count=8)
    from_graph = predict_sharded(place(g, placement), target=IPU2,
                                 gradient_accumulation_count=8)
    assert from_exe.stage_of_step == from_graph.stage_of_step == (0, 0, 1, 1, 1, 1, 0, 0)
    assert from_exe.step_cycles == from_graph.step_cycles
    assert [c.nbytes for c in from_exe.copies] == [32768, 32768]
    assert ([p.memory.not_always_live_bytes for p in from_exe.ipus]
            == [p.memory.not_always_live_bytes for p in from_graph.ipus])


def test_weight_update_runs_once_per_step():
    g = two_stage_training()
    c = [s.cycles for s in predict_costs(g, target=IPU2).steps]
    # Pretend the last node (stage 0) is the weight update: it and the copy
    # it waits for (ga, 1 -> 0) run once per step, after the pipeline drains.
    two = placed(g, {"m/s0": 0, "m/s1": 1})

    def update(node):
        return node.primitive.name == "mul" and node.stage == 0

    p = predict_sharded(two, target=IPU2, gradient_accumulation_count=8,
                        weight_update=update)
    ipu0, ipu1 = p.ipus
    f0, w0 = c[0] + c[1], c[5] + LINK_CYCLES_32K
    f1 = c[2] + c[3] + c[4] + LINK_CYCLES_32K
    assert (ipu0.forward_cycles, ipu0.backward_cycles, ipu0.weight_update_cycles) == (f0, 0, w0)
    assert p.copies[1].phase == "update"
    assert p.step_cycles == 9 * max(f0, f1) + w0
    seq = predict_sharded(two, target=IPU2, schedule="Sequential",
                          gradient_accumulation_count=8, weight_update=update)
    assert seq.step_cycles == 8 * (f0 + f1) + w0
    assert p.utilisation == pytest.approx((8 * (f0 + f1) + w0) / (2 * p.step_cycles))


def test_a_value_of_the_weights_alone_is_not_stashed_per_micro_batch():
    """In a micro-batch loop, stage 0's backward reads its activation `a`
    (made from the micro-batch) and a transposed weight (made from the
    weights alone, the same for every micro-batch), both through one
    barrier: only `a` is stashed once per micro-batch in flight."""
    def body(b, acc, x, w1, w2):
        a = b.op("tanh", b.op("dot_general", x, w1, dimension_numbers=MM, source="m/s0"),
                 source="m/s0")
        wt = b.op("transpose", w1, permutation=(1, 0), source="m/s0")  # f32[128,32]
        # A barrier bundling both (a recomputation checkpoint) keeps each apart.
        a, wt = b.op("optimization_barrier", a, wt, source="m/s0")
        o = b.op("dot_general", a, w2, dimension_numbers=MM, source="m/s1")
        ga = b.op("dot_general", b.op("mul", o, o, source="m/s1"), w2,
                  dimension_numbers=MM_T, source="m/s1")
        gx = b.op("dot_general", ga, wt, dimension_numbers=MM, source="m/s0")
        total = b.op("add", b.op("reduce_sum", b.op("mul", ga, a, source="m/s0"),
                                 axes=(0, 1), source="m/s0"),
                     b.op("reduce_sum", gx, axes=(0, 1), source="m/s0"), source="m/s0")
        return b.op("add", acc, total, source="m/s0")

    step = build([aval(()), aval((64, 32)), aval((32, 128)), aval((128, 16))], body)
    g = build([aval(()), aval((4, 64, 32)), aval((32, 128)), aval((128, 16))],
              lambda b, acc, xs, w1, w2: b.op("scan", acc, xs, w1, w2, body=step, length=4,
                                              reverse=False, n_carry=1, n_xs=1, unroll=1))
    p = predict_sharded(placed(g, {"m/s0": 0, "m/s1": 1}), target=IPU2,
                        gradient_accumulation_count=4)
    ipu0, ipu1 = p.ipus
    assert ipu0.in_flight == 3
    assert ipu0.stash_bytes == 64 * 128 * 4  # a; not wt's 128 * 32 * 4
    assert ipu1.stash_bytes == 0


def _three_stages_on_two_ipus():
    """A micro-batch loop (accumulator carry) over stages s0, s1, s2 on IPUs
    0, 1, 0 (BERT's embedding and heads share IPU 0): s0's backward reads
    `h` and `a` (f32[64,128], 32 KiB each), s1's reads `o` (f32[64,16],
    4 KiB), and the last stage's `g2` (32 KiB), a gradient of a weight s0
    also uses, is added to the accumulator by s0's steps."""
    def body(b, acc, x, w1, w2, w3):
        h = b.op("dot_general", x, w1, dimension_numbers=MM, source="m/s0")
        a = b.op("tanh", h, source="m/s0")
        o = b.op("dot_general", a, w2, dimension_numbers=MM, source="m/s1")
        y = b.op("dot_general", o, w3, dimension_numbers=MM, source="m/s2")
        g2 = b.op("mul", y, y, source="m/s2")
        go = b.op("mul", b.op("dot_general", g2, w3, dimension_numbers=MM_T, source="m/s1"),
                  o, source="m/s1")
        ga = b.op("dot_general", go, w2, dimension_numbers=MM_T, source="m/s1")
        g0 = b.op("add", b.op("mul", ga, a, source="m/s0"), b.op("mul", ga, h, source="m/s0"),
                  source="m/s0")
        return b.op("add", acc, b.op("add", g0, g2, source="m/s0"), source="m/s0")

    weights = [aval((32, 128)), aval((128, 16)), aval((16, 128))]
    step = build([aval((64, 128)), aval((64, 32))] + weights, body)
    return build([aval((64, 128)), aval((4, 64, 32))] + weights,
                 lambda b, acc, xs, *w: b.op("scan", acc, xs, *w, body=step, length=4,
                                             reverse=False, n_carry=1, n_xs=1, unroll=1))


def test_each_stage_of_an_ipu_stashes_for_its_own_place_in_the_pipeline():
    # Graphcore's FIFO of stage s holds multiplier x (last stage - s)
    # micro-batches (pipeline_fifo_inserter.cc), plus the one in the stage;
    # s counts the pipeline's 3 stages, not its 2 IPUs.
    assert [in_flight("Grouped", s, 3) for s in range(3)] == [5, 3, 1]
    assert [in_flight("Interleaved", s, 3) for s in range(3)] == [3, 2, 1]
    assert [in_flight("Sequential", s, 3) for s in range(3)] == [1, 1, 1]
    g = placed(_three_stages_on_two_ipus(), {"m/s0": 0, "m/s1": 1, "m/s2": 2}, [0, 1, 0])
    preds = {s: predict_sharded(g, target=IPU2, gradient_accumulation_count=4, schedule=s)
             for s in ("Grouped", "Interleaved", "Sequential")}
    ipu0, ipu1 = preds["Grouped"].ipus
    assert ipu0.stages == (0, 2) and ipu1.stages == (1,)
    # IPU 0: only stage 0's `h` and `a`; the last stage's g2 goes into the
    # shared accumulator in its own stage (GradientAccumulatorSink), stashed
    # nowhere.
    assert ipu0.stashes == ((0, 65536, 5),) and ipu0.in_flight == 5
    assert ipu1.stashes == ((1, 4096, 3),) and ipu1.in_flight == 3
    nal = {s: [p.memory.not_always_live_bytes for p in q.ipus] for s, q in preds.items()}
    assert [a - b for a, b in zip(nal["Grouped"], nal["Sequential"])] == [4 * 65536, 2 * 4096]
    assert [a - b for a, b in zip(nal["Interleaved"], nal["Sequential"])] == [2 * 65536, 4096]
    tile = [memory_model.tile_bytes(aval(s), IPU2.tiles_per_ipu) for s in ((64, 128), (64, 16))]
    tiles = {s: [p.memory.tile_bytes for p in q.ipus] for s, q in preds.items()}
    assert [a - b for a, b in zip(tiles["Grouped"], tiles["Sequential"])] == [
        4 * 2 * tile[0], 2 * tile[1]]
