"""The XSpace (`<host>.xplane.pb`) the ipu profiler writes for TensorBoard's
current profile plugin: its structure, and the plugin's own converter
(xprof, from the test extra) reading it as the trace viewer, the overview
page and the memory profile do."""

import glob
import json
import os

import numpy as np
import pytest

from keras_ipu.backend import tensorboard as tb
from keras_ipu.device.simulator import profile
from keras_ipu.report import timeline
from keras_ipu.report import xspace

from test_tensorboard_profile import tiny_executable


@pytest.fixture(autouse=True)
def no_trace_left_running():
    yield
    if tb._trace is not None:
        tb.stop_trace(save=False)


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    """A trace of three profiled batches, one run each (the third without
    step detail), as Keras' TensorBoard callback makes it."""
    logdir = tmp_path_factory.mktemp("logs")
    exe = tiny_executable()
    tb.start_trace(str(logdir))
    for batch in (4, 5, 6):
        ctx = tb.start_batch_trace(batch)
        exe.run(np.ones(64, np.float32))
        tb.stop_batch_trace(ctx)
    tb.stop_trace(save=True)
    (path,) = glob.glob(os.path.join(logdir, "plugins", "profile", "*", "*.xplane.pb"))
    return exe, path


def read_space(path):
    space = xspace._xplane_pb2().XSpace()
    with open(path, "rb") as f:
        space.ParseFromString(f.read())
    return space


def events_of(plane, line_name):
    (line,) = [x for x in plane.lines if x.name == line_name]
    names = {k: m.name for k, m in plane.event_metadata.items()}
    stat_names = {k: m.name for k, m in plane.stat_metadata.items()}

    def value(s):
        return getattr(s, s.WhichOneof("value"))

    return [(names[e.metadata_id], e.offset_ps, e.duration_ps,
             {stat_names[s.metadata_id]: value(s) for s in e.stats}) for e in line.events]


def test_xspace_has_the_host_plane_and_a_plane_per_ipu(profiled):
    exe, path = profiled
    space = read_space(path)
    assert os.path.basename(path) == f"{space.hostnames[0]}.xplane.pb"
    assert [p.name for p in space.planes] == ["/host:CPU", "/device:CUSTOM:IPU:0 (predicted)"]
    host, ipu = space.planes

    # Step markers as TensorFlow's profiler writes them for Keras.
    (thread,) = [x.name for x in host.lines if x.name.startswith("python")]
    events = events_of(host, thread)
    markers = [e for e in events if e[0] == "train"]
    assert [e[3]["step_num"] for e in markers] == [4, 5, 6]
    assert all(e[3]["_r"] == 1 for e in markers)
    runs = [e for e in events if e[0] != "train"]
    assert len(runs) == 3 and all(not r[0].startswith(("train", "test")) for r in runs)
    for marker, run in zip(markers, runs):  # each run inside its batch
        assert marker[1] <= run[1] and run[1] + run[2] <= marker[1] + marker[2]

    # The IPU plane: the timeline's lanes, the steps with op, layer, cycles.
    lanes = [x.name for x in ipu.lines]
    assert lanes == list(timeline.LANES) + [xspace.COUNTER_LINE]
    pred = profile.prediction_of(exe)
    run_events = events_of(ipu, "Program runs")
    assert [e[3]["cycles"] for e in run_events] == [pred.cycles] * 3
    assert run_events[0][2] == pytest.approx(
        pred.step_seconds * pred.steps_per_run * 1e12, abs=1)
    assert "steps not drawn" in run_events[2][0]
    steps = events_of(ipu, "Program steps")
    assert [e[3]["op"] for e in steps] == [s.name for s in pred.steps] * 2
    assert sum(e[3]["cycles"] for e in steps) == 2 * pred.cycles
    assert all(e[3]["output bytes"] == 64 * 4 for e in steps)  # each makes an f32[64]
    if len(pred.steps) == 2:
        assert [e[3]["layer"] for e in steps[:2]] == ["model/act", "model/residual"]
    counters = events_of(ipu, xspace.COUNTER_LINE)
    mem = profile.memory_of(exe)
    assert counters[0][3]["always live"] == mem.always_live_bytes
    assert max(c[3]["not always live"] for c in counters) == mem.not_always_live_bytes
    stats = {ipu.stat_metadata[s.metadata_id].name: s for s in ipu.stats}
    assert stats["clock_hz"].double_value == pred.target.clock_hz

    # Memory activity for the plugin's memory profile: allocations and
    # frees balance, and the peak is the memory report's total.
    memory = events_of(host, "IPU 0 memory activity (predicted)")
    kinds = [e[0] for e in memory]
    assert set(kinds) == {"MemoryAllocation", "MemoryDeallocation"}
    assert memory[-1][3]["bytes_allocated"] == 0
    assert max(e[3]["peak_bytes_in_use"] for e in memory) == mem.total_bytes


def test_the_plugins_converter_reads_it(profiled):
    """TensorBoard's profile plugin converts XSpaces with xprof's C++
    converter: its trace viewer shows our IPU lanes, its overview page finds
    the profiled batches as steps, its memory profile our IPU allocator."""
    raw_to_tool_data = pytest.importorskip(
        "xprof.convert.raw_to_tool_data",
        reason="the profile plugin (tensorboard-plugin-profile, in the test extra) "
               "is not installed")
    exe, path = profiled
    tools = raw_to_tool_data.xspace_to_tool_names([path])
    assert {"trace_viewer@", "overview_page", "memory_profile"} <= set(tools)

    data, _ = raw_to_tool_data.xspace_to_tool_data(
        [path], "trace_viewer@", {"trace_viewer_options": {"resolution": 0}})
    trace = json.loads(data)
    processes = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"]
                 if e.get("name") == "process_name"}
    # (the plugin puts the host name in front of the plane's)
    (ipu_pid,) = [p for p, n in processes.items()
                  if n.endswith(" /device:CUSTOM:IPU:0 (predicted)")]
    threads = {e["tid"]: e["args"]["name"] for e in trace["traceEvents"]
               if e.get("name") == "thread_name" and e["pid"] == ipu_pid}
    pred = profile.prediction_of(exe)
    steps_tid = [t for t, n in threads.items() if n == "Program steps"][0]
    steps = [e for e in trace["traceEvents"]
             if e.get("pid") == ipu_pid and e.get("tid") == steps_tid and e.get("ph") == "X"]
    assert len(steps) == 2 * len(pred.steps)
    assert sum(e["dur"] for e in steps) == pytest.approx(
        2 * pred.device_seconds * 1e6, rel=1e-6)
    counters = [e for e in trace["traceEvents"] if e.get("ph") == "C"]
    assert counters and counters[0]["name"] == timeline.MEMORY_COUNTER.format(ipu=0)
    markers = [e for e in trace["traceEvents"] if e.get("name", "").startswith("train ")]
    assert sorted(e["name"] for e in markers) == ["train 4", "train 5", "train 6"]

    data, _ = raw_to_tool_data.xspace_to_tool_data([path], "overview_page", {})
    (steps_table,) = [t for t in json.loads(data)
                      if "steptime_ms_average" in t.get("p", {})]
    # The profiled batches are its steps (their host time: the simulator's).
    assert [row["c"][0]["v"] for row in steps_table["rows"]] == ["train 4", "train 5", "train 6"]

    data, _ = raw_to_tool_data.xspace_to_tool_data([path], "memory_profile", {})
    memory = json.loads(data)["memoryProfilePerAllocator"]
    (allocator,) = memory
    assert allocator == "IPU 0 (predicted)"
    peak = int(memory[allocator]["profileSummary"]["peakStats"]["peakBytesInUse"])
    assert peak == profile.memory_of(exe).total_bytes


def test_memory_profile_of_two_programs_has_one_peak(tmp_path):
    """Two programs on one allocator: the memory profile's lifetime peak and
    its window peak are the same number, the larger program's total (the
    plugin takes the lifetime peak from the last event)."""
    raw_to_tool_data = pytest.importorskip(
        "xprof.convert.raw_to_tool_data",
        reason="the profile plugin (tensorboard-plugin-profile) is not installed")
    import keras

    from keras_ipu.device.jit import jit

    small = jit(lambda x: keras.ops.exp(x) + x)
    large = jit(lambda x: keras.ops.matmul(keras.ops.tanh(x), x) + 1.0)
    a, b = np.ones(64, np.float32), np.ones((256, 256), np.float32)
    small(a), large(b)  # compiled before the trace
    tb.start_trace(str(tmp_path))
    large(b)
    small(a)  # the smaller program last
    tb.stop_trace(save=True)
    (path,) = glob.glob(os.path.join(tmp_path, "plugins", "profile", "*", "*.xplane.pb"))
    data, _ = raw_to_tool_data.xspace_to_tool_data([path], "memory_profile", {})
    allocator = json.loads(data)["memoryProfilePerAllocator"]["IPU 0 (predicted)"]
    summary = allocator["profileSummary"]
    totals = [profile.memory_of(f.executables()[0]).total_bytes for f in (small, large)]
    assert int(summary["peakStats"]["peakBytesInUse"]) == max(totals)
    assert int(summary["peakBytesUsageLifetime"]) == max(totals)
    # What the memory timeline graph plots: rising to each program's total.
    timeline_bytes = [int(s["aggregationStats"]["heapAllocatedBytes"])
                      for s in allocator["sampledTimelineSnapshots"]]
    assert len(timeline_bytes) > 4 and max(timeline_bytes) == max(totals)
    assert timeline_bytes[-1] == 0
