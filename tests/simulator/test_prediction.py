"""Predictions of whole programs: sums over steps, control flow, fusion,
throughput, the printed table and --log_cycle_count logging."""

import logging
import math

import numpy as np
import pytest

from keras_ipu.device.compiler import CompileOptions
from keras_ipu.device.compiler import compile_graph
from keras_ipu.device.config import IPUConfig
from keras_ipu.device.config import system_config
from keras_ipu.device.simulator import cost_model as cm
from keras_ipu.device.simulator.memory_model import graph_of
from keras_ipu.device.simulator.prediction import predict_costs
from keras_ipu.device.simulator.targets import TARGETS

from compiler_graphs import aval
from compiler_graphs import build

IPU2 = TARGETS["ipu2"]
MM = (((1,), (0,)), ((), ()))


def mlp_graph():
    def body(b, x, w):
        h = b.op("dot_general", x, w, dimension_numbers=MM, source="model/dense")
        return b.op("tanh", h, source="model/dense/activation")

    return build([aval((64, 32)), aval((32, 128))], body)


def test_cycles_are_the_sum_over_steps():
    p = predict_costs(mlp_graph(), target=IPU2, batch_size=64)
    dot, tanh = p.steps
    assert dot.macs == 64 * 32 * 128
    assert dot.compute == math.ceil(262144 / (256 * 16 * cm.MATMUL_EFFICIENCY)) + cm.VERTEX_OVERHEAD_CYCLES
    # tanh: 8192 outputs x TRANSCENDENTAL_FLOPS over 256 tiles, 2 lanes, and
    # the load/store cycles of each of the 16 vectors on the busiest tile.
    assert tanh.compute == (math.ceil(8192 * cm.TRANSCENDENTAL_FLOPS / (256 * 2))
                            + cm.ELEMENTWISE_LOOP_OVERHEAD_CYCLES * 8192 // (256 * 2)
                            + cm.VERTEX_OVERHEAD_CYCLES)
    assert p.sync_cycles == 2 * cm.SYNC_CYCLES
    assert p.cycles == sum(s.cycles for s in p.steps)
    assert p.cycles_per_step == p.cycles
    host = cm.host_transfer_seconds((64 * 32 + 32 * 128) * 4, IPU2) + cm.host_transfer_seconds(64 * 128 * 4, IPU2)
    assert p.host_seconds == pytest.approx(host)
    assert p.step_seconds == pytest.approx(p.cycles / 1.33e9 + host)
    assert p.samples_per_second == pytest.approx(64 / p.step_seconds)
    text = str(p)
    assert "cycles per step" in text and "model/dense" in text and "samples/s" in text


def test_resident_inputs_and_steps_per_run():
    g = mlp_graph()
    all_in = predict_costs(g, target=IPU2)
    weights_stay = predict_costs(g, target=IPU2, resident_inputs=(1,), steps_per_run=4)
    assert weights_stay.host_bytes_in == 64 * 32 * 4
    assert weights_stay.cycles_per_step == pytest.approx(all_in.cycles / 4)


def test_faster_clock_is_faster():
    g = mlp_graph()
    assert predict_costs(g, target="ipu21").step_seconds < predict_costs(g, target="ipu2").step_seconds


def test_executable_and_fused_kernels():
    g = mlp_graph()
    exe = compile_graph(g)
    p = predict_costs(exe, target=IPU2)
    assert p.cycles == predict_costs(g, target=IPU2).cycles  # one op each, nothing fused

    def chain(b, x):
        return b.op("mul", b.op("add", x, x), x)

    unfused = predict_costs(compile_graph(build([aval((4096,))], chain), CompileOptions(fuse_elementwise=False)), target=IPU2)
    fused_exe = compile_graph(build([aval((4096,))], chain))
    assert [n.primitive.name for n in fused_exe.steps] == ["fused_elementwise"]
    fused = predict_costs(fused_exe, target=IPU2)
    assert fused.steps[0].flops == 2 * 4096 == sum(s.flops for s in unfused.steps)
    assert fused.cycles < unfused.cycles  # one sync and one vertex launch fewer


def body_graph():
    # carry c:f32[512], x_t:f32[512] -> (c + x_t, c * x_t)
    b = build([aval((512,)), aval((512,))], lambda b, c, x: [b.op("add", c, x), b.op("mul", c, x)])
    return b


def test_scan_costs_length_times_its_body():
    body = body_graph()
    body_pred = predict_costs(body, target=IPU2)
    g = build([aval((512,)), aval((10, 512))], lambda b, c, xs: b.op(
        "scan", c, xs, body=body, length=10, reverse=False, n_carry=1, n_xs=1, unroll=1))
    p = predict_costs(g, target=IPU2)
    assert p.steps[0].kind == "loop"
    assert p.cycles == 10 * body_pred.cycles
    assert p.steps[0].flops == 10 * 2 * 512


def test_a_loop_body_is_costed_as_it_runs_fused():
    # carry c:f32[4096], x_t:f32[4096] -> (c + x_t) * x_t: a chain the
    # body's own compile fuses into one compute set.
    body = build([aval((4096,)), aval((4096,))],
                 lambda b, c, x: b.op("mul", b.op("add", c, x), x))
    g = build([aval((4096,)), aval((10, 4096))], lambda b, c, xs: b.op(
        "scan", c, xs, body=body, length=10, reverse=False, n_carry=1, n_xs=1, unroll=1))
    exe = compile_graph(g)
    (loop,) = graph_of(exe).nodes
    assert [n.primitive.name for n in loop.params["body"].nodes] == ["fused_elementwise"]
    # By hand on ipu2 (1,472 tiles): 16 KiB in 8-byte grains, at least 128 B
    # a tile, spread over 128 tiles; 2 x 4096 FLOPs at 2 float32 lanes, 16
    # vectors of 2 load/store cycles, one vertex launch, one sync.
    tiles, vectors = 128, 4096 // (128 * 2)
    fused = (2 * 4096 // (tiles * 2) + cm.ELEMENTWISE_LOOP_OVERHEAD_CYCLES * vectors
             + cm.VERTEX_OVERHEAD_CYCLES + cm.SYNC_CYCLES)
    assert predict_costs(exe, target=IPU2).cycles == 10 * fused
    # The same body compiled outside a loop costs the same.
    assert predict_costs(compile_graph(body), target=IPU2).cycles == fused
    # The traced body (add, then mul) would cost a launch and a sync more.
    one_op = 4096 // (tiles * 2) + cm.ELEMENTWISE_LOOP_OVERHEAD_CYCLES * vectors + (
        cm.VERTEX_OVERHEAD_CYCLES + cm.SYNC_CYCLES)
    assert predict_costs(g, target=IPU2).cycles == 10 * 2 * one_op


def test_cond_counts_its_costliest_branch():
    cheap = build([aval((512,))], lambda b, x: b.op("neg", x))
    dear = build([aval((512,))], lambda b, x: b.op("exp", b.op("exp", x)))
    g = build([aval((), "int32"), aval((512,))],
              lambda b, i, x: b.op("cond", i, x, branches=(cheap, dear)))
    p = predict_costs(g, target=IPU2)
    assert p.cycles == predict_costs(dear, target=IPU2).cycles


def test_while_loop_uses_the_stated_trip_assumption():
    cond = build([aval((), "int32"), aval((512,))], lambda b, i, x: b.op("lt", i, i))
    body = build([aval((), "int32"), aval((512,))], lambda b, i, x: [b.op("add", i, i), b.op("neg", x)])
    g = build([aval((), "int32"), aval((512,))], lambda b, i, x: b.op(
        "while_loop", i, x, cond_graph=cond, body_graph=body, n_cond_consts=0))
    p = predict_costs(g, target=IPU2)
    n = cm.WHILE_LOOP_ASSUMED_TRIPS
    expected = n * predict_costs(body, target=IPU2).cycles + (n + 1) * predict_costs(cond, target=IPU2).cycles
    assert p.cycles == expected


def test_log_cycle_count(caplog):
    with caplog.at_level(logging.INFO, logger="keras_ipu.cycles"):
        predict_costs(mlp_graph(), target=IPU2, batch_size=8, log=True)
    assert "cycles per step" in caplog.text and "samples/s" in caplog.text


def test_check_memory_raises_through_predict():
    from keras_ipu.device.simulator.memory_model import IPUOutOfMemoryError

    g = build([aval((16,))], lambda b, x: b.op("broadcast_to", x, shape=(20_000_000, 16)))
    with pytest.raises(IPUOutOfMemoryError):
        predict_costs(g, target=IPU2, check_memory=True)
    assert predict_costs(g, target=IPU2).memory.fits is False


def test_unknown_object_is_refused():
    with pytest.raises(TypeError, match="Graph or an"):
        predict_costs(np.zeros(3), target=IPU2)


@pytest.fixture
def no_system():
    system_config.reset_ipu_configuration()
    yield
    system_config.reset_ipu_configuration()


def test_log_cycle_count_flag_turns_logging_on(caplog, monkeypatch, no_system):
    # The flags of the configured system count, not the environment's now.
    monkeypatch.setenv("TF_POPLAR_FLAGS", "--log_cycle_count=0")
    system_config.configure_ipu_system(IPUConfig())
    monkeypatch.delenv("TF_POPLAR_FLAGS")
    with caplog.at_level(logging.INFO, logger="keras_ipu.cycles"):
        predict_costs(mlp_graph(), target=IPU2)
    assert "Predicted cycles" in caplog.text
    caplog.clear()
    system_config.configure_ipu_system(IPUConfig())
    with caplog.at_level(logging.INFO, logger="keras_ipu.cycles"):
        predict_costs(mlp_graph(), target=IPU2)
    assert "Predicted cycles" not in caplog.text


def test_log_cycle_count_from_the_environment_without_a_system(caplog, monkeypatch,
                                                                 no_system):
    # TF_POPLAR_FLAGS alone, before any system exists: the same flags the
    # default system would be built with (system_config.configuration).
    monkeypatch.setenv("TF_POPLAR_FLAGS", "--log_cycle_count=0")
    with caplog.at_level(logging.INFO, logger="keras_ipu.cycles"):
        predict_costs(mlp_graph(), target=IPU2)
    assert "Predicted cycles" in caplog.text
    assert system_config.configured_system() is None  # reading a flag made no system


@pytest.mark.parametrize(
    "flags, sent_in, read_out",
    [
        ("", True, True),
        ("--use_synthetic_data", False, False),
        ("--synthetic_data_categories=infeed", False, True),
        ("--synthetic_data_categories=outfeed", True, False),
    ],
)
def test_synthetic_data_removes_its_host_transfers(monkeypatch, flags, sent_in, read_out,
                                                  no_system):
    monkeypatch.setenv("TF_POPLAR_FLAGS", flags)
    p = predict_costs(mlp_graph(), IPU2)
    # in: x f32[64,32] + w f32[32,128]; out: f32[64,128].
    assert p.host_bytes_in == (64 * 32 * 4 + 32 * 128 * 4 if sent_in else 0)
    assert p.host_bytes_out == (64 * 128 * 4 if read_out else 0)
    expected = sum(cm.host_transfer_seconds(b, IPU2) for b in (p.host_bytes_in, p.host_bytes_out))
    assert p.host_seconds == pytest.approx(expected)
