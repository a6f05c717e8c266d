"""Profile options and the per-executable JSON report, by hand on a tiny graph."""

import json
import os

import numpy as np
import pytest

from keras_ipu.device.compiler import CompileOptions
from keras_ipu.device.compiler import compile_graph
from keras_ipu.device.config import ExecutionProfileType
from keras_ipu.device.config import IPUConfig
from keras_ipu.device.simulator import cost_model as cm
from keras_ipu.device.simulator import profile
from keras_ipu.device.simulator import tile_mapping
from keras_ipu.device.simulator.memory_model import analyze_memory
from keras_ipu.device.simulator.prediction import predict_costs
from keras_ipu.device.simulator.targets import TARGETS

from compiler_graphs import aval
from compiler_graphs import build

IPU2 = TARGETS["ipu2"]
ALL = '{"autoReport.all":"true","autoReport.directory":"%s"}'


def env(text):
    return {profile.ENV_VAR: text}


def tiny_executable():
    # x:f32[256] (1 KiB); a = exp x; b = a + x; c = sum b.
    def body(b, x):
        a = b.op("exp", x, source="model/act")
        s = b.op("add", a, x, source="model/residual")
        return b.op("reduce_sum", s, axes=(0,), source="model/pool")

    graph = build([aval((256,))], body)
    return compile_graph(graph, CompileOptions(fuse_elementwise=False))


class FakeConfig:
    def __init__(self, values):
        self.values = values

    def to_dict(self):
        return dict(self.values)


# -- options ----------------------------------------------------------------------
def test_profiling_is_off_without_options():
    assert profile.report_options({}, FakeConfig({})) is None
    assert profile.report_options(env('{"autoReport.directory":"d"}'), FakeConfig({})) is None
    # Other Poplar engine options are not the profile's business.
    assert profile.report_options(env('{"debug.allowOutOfMemory":"true"}'),
                                  FakeConfig({})) is None


def test_auto_report_all_turns_on_both_profiles():
    o = profile.report_options(env(ALL % "/tmp/r"), FakeConfig({}))
    assert o.directory == "/tmp/r"
    assert o.graph_profile and o.execution_profile
    assert o.sources == ("POPLAR_ENGINE_OPTIONS",)


def test_single_outputs_and_json_booleans():
    o = profile.report_options(env('{"autoReport.outputGraphProfile": true}'), FakeConfig({}))
    assert o.graph_profile and not o.execution_profile
    assert o.directory == "."  # Poplar's default: the current directory
    o = profile.report_options(
        env('{"autoReport.all":"true","autoReport.outputExecutionProfile":"false"}'),
        FakeConfig({}))
    assert o.graph_profile and not o.execution_profile


def test_bad_json_names_the_value_and_the_fix():
    with pytest.raises(profile.ProfileOptionsError) as e:
        profile.report_options(env("{autoReport.all: true}"), FakeConfig({}))
    msg = str(e.value)
    assert "POPLAR_ENGINE_OPTIONS is not valid JSON" in msg
    assert "{autoReport.all: true}" in msg
    assert '"autoReport.all":"true"' in msg  # the example to copy
    with pytest.raises(profile.ProfileOptionsError, match="must be a JSON object"):
        profile.report_options(env('["autoReport.all"]'), FakeConfig({}))


def test_unknown_auto_report_option_suggests_the_known_one():
    with pytest.raises(profile.ProfileOptionsError) as e:
        profile.report_options(env('{"autoReport.outputExecutionProfil":"true"}'),
                               FakeConfig({}))
    msg = str(e.value)
    assert "'autoReport.outputExecutionProfil'" in msg
    assert "Did you mean 'autoReport.outputExecutionProfile'" in msg
    assert "autoReport.directory" in msg  # the list of known options


def test_bad_values_are_errors():
    with pytest.raises(profile.ProfileOptionsError, match=r"'autoReport.all' \(got 'yes'\)"):
        profile.report_options(env('{"autoReport.all":"yes"}'), FakeConfig({}))
    with pytest.raises(profile.ProfileOptionsError, match="non-negative integer"):
        profile.report_options(
            env('{"autoReport.all":"true","autoReport.executionProfileProgramRunCount":"x"}'),
            FakeConfig({}))
    with pytest.raises(profile.ProfileOptionsError, match="directory path"):
        profile.report_options(env('{"autoReport.all":"true","autoReport.directory":""}'),
                               FakeConfig({}))


def test_ipu_config_compilation_poplar_options_and_env_precedence():
    cfg = IPUConfig()
    cfg.compilation_poplar_options = {"autoReport.all": "true",
                                      "autoReport.directory": "/from/config"}
    o = profile.report_options({}, cfg)
    assert o.directory == "/from/config" and o.execution_profile
    assert o.sources == ("IPUConfig.compilation_poplar_options",)
    # The environment wins, as it does over Poplar's programmatic options.
    o = profile.report_options(env('{"autoReport.directory":"/from/env"}'), cfg)
    assert o.directory == "/from/env"
    cfg.compilation_poplar_options = {"autoReport.bogus": "true"}
    with pytest.raises(profile.ProfileOptionsError, match="compilation_poplar_options"):
        profile.report_options({}, cfg)


def test_execution_profile_type_option_turns_profiling_on():
    on = FakeConfig({"profiling.type": ExecutionProfileType.IPU_PROFILE})
    o = profile.report_options({}, on)
    assert o.graph_profile and o.execution_profile
    assert o.execution_profile_type is ExecutionProfileType.IPU_PROFILE
    off = FakeConfig({"profiling.type": ExecutionProfileType.NO_PROFILE})
    assert profile.report_options({}, off) is None


# -- the report -------------------------------------------------------------------
def test_memory_and_liveness_by_hand():
    exe = tiny_executable()
    r = profile.build_report(exe, name="tiny")
    # Code per tile (tests/simulator/test_memory_model.py works it out):
    # the fixed code everywhere, plus exp's, add's and sum's step code and
    # codelets where they touch and write.
    fixed, step, codelet = (cm.CONTROL_CODE_BYTES_PER_TILE, cm.CODE_BYTES_PER_STEP_PER_TILE,
                            cm.VERTEX_CODE_BYTES_PER_CODELET)
    code_0_7, code_8_15, code_16 = fixed + 2 * step, fixed + 3 * step + 2 * codelet, (
        fixed + step + codelet)
    code = 1472 * fixed + (16 + 16 + 9) * step + (8 + 8 + 1) * codelet
    assert r["format_version"] == 2 and r["kind"] == "keras_ipu.profile"
    assert r["program"]["name"] == "tiny"
    assert r["program"]["steps"] == 3
    assert r["program"]["input_bytes"] == 1024 and r["program"]["output_bytes"] == 4
    assert r["target"]["name"] == "ipu2"
    assert r["target"]["tiles_per_ipu"] == 1472
    assert r["target"]["memory_per_tile"] == 624 * 1024
    assert r["target"]["clock_hz"] == 1.33e9

    ipu = r["memory"]["ipus"][0]
    assert ipu["inputs"] == 1024
    assert ipu["not_always_live"] == 1028
    assert ipu["always_live"] == 1024 + code
    assert ipu["total"] == ipu["always_live"] + 1028
    assert ipu["capacity"] == 1472 * 624 * 1024
    assert ipu["peak_step"] == 2 and "model/pool" in ipu["peak_step_name"]

    # Linear mapping, each tensor after the previous [TFMAP]: the 1 KiB
    # input x (always live) is 128 B on each of tiles 0..7; a on 8..15; b =
    # a + x, computed in place into a, on 8..15 too; the 4-byte sum c on 16.
    (tiles,) = r["memory"]["tiles"]
    assert len(tiles["always_live"]) == len(tiles["total"]) == 1472
    assert tiles["always_live"][0] == tiles["always_live"][7] == code_0_7 + 128
    assert tiles["always_live"][8] == tiles["always_live"][15] == code_8_15
    assert tiles["always_live"][16] == code_16 and tiles["always_live"][1471] == fixed
    assert tiles["total"][0] == code_0_7 + 128
    assert tiles["total"][8] == code_8_15 + 128
    assert tiles["total"][16] == code_16 + 4
    assert tiles["fullest_tile"] == 8 and tiles["fullest_tile_bytes"] == code_8_15 + 128
    # One truth: the per-tile picture's fullest tile is the memory report's.
    mem = analyze_memory(exe, IPU2)
    assert tiles["fullest_tile_bytes"] == mem.tile_bytes == ipu["fullest_tile_bytes"]
    assert ipu["fullest_tile"] == mem.tile == 8 and ipu["fits"]
    # By category: the plain program's input is a "program input"; code and
    # the values at the peak ("activations") make up the rest, per tile and
    # on the IPU.
    cats = tiles["categories"]
    assert set(cats) == {"program inputs", "code", "activations"}
    assert cats["program inputs"][0] == 128 and cats["activations"][0] == 0
    assert cats["activations"][8] == 128 and cats["activations"][16] == 4
    assert [sum(v[t] for v in cats.values()) for t in (0, 8, 16)] == [
        tiles["total"][0], tiles["total"][8], tiles["total"][16]]
    assert ipu["categories"] == {"program inputs": 1024, "code": code,
                                 "activations": 1028}
    assert ipu["tiles_over_capacity"] == 0 and ipu["most_over_bytes"] == 0
    # What a tile holds at the peak, for the page's hover.
    tensors = {(t["tensor"], t["category"]): t for t in r["memory"]["tensors"]}
    assert tensors[("f32[256]", "program inputs")]["tiles"] == 8
    assert tensors[("f32[]", "activations")]["start"] == 16
    assert tensors[("f32[]", "activations")]["made_by"].startswith("model/pool")

    live = r["liveness"]
    # step 0: {a}; step 1: {b}, in place of a (a and x die at step 1);
    # step 2: {b, c}.
    assert live["not_always_live"] == [1024, 1024, 1028]
    # How far each step raises the fullest tile (8..15's code) above the
    # always-live fullest: a (then b) adds its 128 B there; c goes to 16.
    assert live["tile0"] == [128, 128, 128]
    assert live["peak_step"] == 2 == ipu["peak_step"]
    assert [d["op"] for d in live["steps"]] == ["exp", "add", "reduce_sum"]
    assert live["steps"][2]["live"][0][:2] == ["f32[256]", 1024]
    json.dumps(r)  # JSON-ready


def test_tile_distribution_of_an_uneven_tensor():
    # 1001 float32 (4004 B) over 4 tiles: 501 grains of 8 B, ceil(501 / 4)
    # = 126 grains (1008 B) per tile; the last tile takes the rest.
    d = tile_mapping.distribution(4004, 4, 4)
    assert d.tolist() == [1008, 1008, 1008, 4004 - 3 * 1008]
    # 100 B: one tile (at least 128 B per tile).
    assert tile_mapping.distribution(100, 4, 4).tolist() == [100, 0, 0, 0]
    assert tile_mapping.distribution(0, 4, 4).tolist() == [0, 0, 0, 0]
    # From tile 3 on, wrapping past the last tile.
    assert tile_mapping.distribution(4004, 4, 4, start=3).tolist() == [
        1008, 1008, 4004 - 3 * 1008, 1008]


def test_cycles_and_trace_agree_with_the_prediction():
    exe = tiny_executable()
    r = profile.build_report(exe)
    pred = predict_costs(exe, IPU2, log=False)
    cyc = r["cycles"]
    assert cyc["total"] == pred.cycles
    assert [s["op"] for s in cyc["steps"]] == ["exp", "add", "reduce_sum"]
    assert [s["source"] for s in cyc["steps"]] == ["model/act", "model/residual", "model/pool"]
    for s, p in zip(cyc["steps"], pred.steps):
        assert (s["compute"], s["exchange"], s["sync"]) == (p.compute, p.exchange, p.sync)
        assert s["cycles"] == p.compute + p.exchange + p.sync
        assert s["sync"] == cm.SYNC_CYCLES
    assert sorted(o["op"] for o in cyc["ops"]) == ["add", "exp", "reduce_sum"]
    assert [o["cycles"] for o in cyc["ops"]] == sorted(
        (o["cycles"] for o in cyc["ops"]), reverse=True)
    assert sum(o["cycles"] for o in cyc["ops"]) == pred.cycles

    trace = r["execution_trace"]
    assert [e["index"] for e in trace] == [0, 1, 2]
    assert trace[0]["start"] == 0 and trace[-1]["end"] == pred.cycles
    for e, s in zip(trace, cyc["steps"]):
        assert e["end"] - e["start"] == s["cycles"]
        assert e["compute"] == [e["start"], e["start"] + s["compute"]]
        assert e["sync"] == [e["compute"][1], e["compute"][1] + s["sync"]]
        assert e["exchange"] == [e["sync"][1], e["end"]]
    for before, after in zip(trace, trace[1:]):
        assert after["start"] == before["end"]


def test_attached_prediction_is_used():
    exe = tiny_executable()
    exe.prediction = predict_costs(exe, IPU2, batch_size=8, log=False)
    r = profile.build_report(exe)
    assert r["cycles"]["batch_size"] == 8
    assert r["cycles"]["samples_per_second"] == pytest.approx(
        8 / exe.prediction.step_seconds)


def test_graph_profile_only_leaves_the_execution_sections_out():
    o = profile.report_options(env('{"autoReport.outputGraphProfile":"true"}'), FakeConfig({}))
    r = profile.build_report(tiny_executable(), o)
    assert r["memory"] is not None and r["liveness"] is not None
    assert r["cycles"] is None and r["execution_trace"] is None


def test_write_is_atomic_and_names_are_unique(tmp_path):
    exe = tiny_executable()
    o = profile.report_options(env(ALL % tmp_path), FakeConfig({}))
    a = profile.write_executable_report(exe, o, name="train step")
    b = profile.write_executable_report(exe, o, name="train step")
    assert a != b and os.path.dirname(a) == str(tmp_path)
    assert os.path.basename(a).startswith("train_step_")
    assert a.endswith(profile.SUFFIX)
    assert sorted(os.listdir(tmp_path)) == sorted([os.path.basename(a), os.path.basename(b)])
    with open(a) as f:
        r = json.load(f)
    assert r["program"]["fingerprint"] in os.path.basename(a)
    assert r["options"]["directory"] == str(tmp_path)


def test_write_executable_report_reads_the_environment(tmp_path, monkeypatch):
    exe = tiny_executable()
    monkeypatch.delenv(profile.ENV_VAR, raising=False)
    monkeypatch.setattr(profile, "_current_config", lambda: None)
    assert profile.report_options() is None
    assert profile.write_executable_report(exe) is None
    monkeypatch.setenv(profile.ENV_VAR, ALL % (tmp_path / "sub"))
    path = profile.write_executable_report(exe)
    assert os.path.exists(path) and os.path.dirname(path) == str(tmp_path / "sub")


def test_note_run_reaches_listeners_only_while_registered():
    exe = tiny_executable()
    seen = []

    def listener(e, start, end):
        seen.append((e, start, end))

    profile.note_run(exe)  # no listener: nothing happens
    profile.add_run_listener(listener)
    try:
        profile.note_run(exe, 1.0, 2.0)
    finally:
        profile.remove_run_listener(listener)
    profile.note_run(exe, 3.0, 4.0)
    assert seen == [(exe, 1.0, 2.0)]


# -- control flow: a device loop is one scan step of the outer program -------------
def scan_graph(length=4):
    # carry c:f32[256]; body: t = exp c; c' = t + c; scanned `length` times.
    def body_fn(b, c):
        t = b.op("exp", c, source="model/act")
        return b.op("add", t, c, source="model/residual")

    body = build([aval((256,))], body_fn)

    def outer(b, x):
        (out,) = b.op("scan", x, body=body, length=length, reverse=False,
                      n_carry=1, n_xs=0, unroll=1, source="train_step")
        return out

    return build([aval((256,))], outer), body


def test_loop_bodies_are_opened_up_in_ops_trace_and_liveness():
    graph, body = scan_graph(length=4)
    exe = compile_graph(graph, CompileOptions(fuse_elementwise=False))
    r = profile.build_report(exe)
    pred = predict_costs(exe, IPU2, log=False)
    body_pred = predict_costs(body, IPU2, log=False)
    assert r["program"]["steps"] == 1 and r["cycles"]["steps"][0]["op"] == "scan"

    # Ops and layers count the body's ops 4 times; they still add up.
    ops = {o["op"]: o for o in r["cycles"]["ops"]}
    assert set(ops) == {"exp", "add"}
    assert ops["exp"]["count"] == 4
    assert ops["exp"]["cycles"] == 4 * body_pred.steps[0].cycles
    assert sum(o["cycles"] for o in ops.values()) == pred.cycles
    layers = {x["layer"]: x["count"] for x in r["cycles"]["layers"]}
    assert layers == {"model/act": 4, "model/residual": 4}

    # The trace: the scan step, and one pass of its body (repeat 4).
    (step,) = r["execution_trace"]
    (loop,) = step["loops"]
    assert loop["repeat"] == 4
    assert [e["op"] for e in loop["trace"]] == ["exp", "add"]
    assert loop["trace"][-1]["end"] * 4 == step["end"] - step["start"] == pred.cycles

    # Liveness inside the body: t (1 KiB) at step 0; c' = t + c at step 1,
    # computed in place into t (its last use).
    (inside,) = r["liveness"]["bodies"]
    assert inside["op"] == "scan" and inside["step"] == 0
    assert inside["not_always_live"] == [1024, 1024] and inside["peak"] == 1024


def test_compiling_with_the_environment_set_writes_a_report(tmp_path, monkeypatch):
    pytest.importorskip("keras_ipu.device.compiler.device_checks")
    from keras_ipu.device.jit import jit
    from keras_ipu.device.primitives import REGISTRY

    monkeypatch.setenv(profile.ENV_VAR, ALL % tmp_path)
    x = np.ones((37, 3), np.float32)  # a shape no other test compiles

    def softplus_ish(v):
        return REGISTRY["log"].bind(REGISTRY["add"].bind(REGISTRY["exp"].bind(v), v))

    jit(softplus_ish)(x)
    (name,) = os.listdir(tmp_path)
    with open(tmp_path / name) as f:
        r = json.load(f)
    assert r["program"]["input_bytes"] == 37 * 3 * 4
    assert r["options"]["sources"] == ["POPLAR_ENGINE_OPTIONS"]
    assert r["cycles"]["total"] > 0 and r["memory"]["ipus"][0]["inputs"] == 37 * 3 * 4
