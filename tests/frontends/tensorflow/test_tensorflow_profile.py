"""Profiles of the TensorFlow front end: TensorFlow's own profiler
(tf.profiler.experimental.start/stop, its Profile context manager) writes
the IPU planes of the bridged programs into its `<host>.xplane.pb`, as the
ipu backend's TensorBoard trace does for a Keras fit; autoReport writes
their JSON reports."""

import glob
import gzip
import json
import os

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from keras_ipu.backend import tensorboard as tb  # noqa: E402
from keras_ipu.device.simulator import profile  # noqa: E402
from keras_ipu.frontends.tensorflow import profiler  # noqa: E402
from keras_ipu.frontends.tensorflow.function import BridgedFunction  # noqa: E402
from keras_ipu.report import timeline  # noqa: E402
from keras_ipu.report import xspace  # noqa: E402

X = np.linspace(-1, 1, 32, dtype=np.float32).reshape(8, 4)
IPU_PLANE = "/device:CUSTOM:IPU:0 (predicted)"
THREAD = "keras_ipu program runs (simulator, wall time)"


def _training_step():
    """A bridged TensorFlow training step (a variable updated in place)."""
    w = tf.Variable(np.full((4, 2), 0.5, np.float32), name="w")

    @tf.function(jit_compile=True)
    def step(x):
        with tf.GradientTape() as tape:
            with tf.name_scope("dense"):
                y = tf.nn.relu(tf.matmul(x, w))
            loss = tf.reduce_mean(y * y)
        w.assign_sub(0.1 * tape.gradient(loss, w))
        return loss

    return BridgedFunction(step), w


@pytest.fixture(autouse=True)
def nothing_left_running():
    yield
    tb.take_trace()
    profiler._recording = None


def _events(plane, line_name):
    (line,) = [x for x in plane.lines if x.name == line_name]
    names = {k: m.name for k, m in plane.event_metadata.items()}
    stat_names = {k: m.name for k, m in plane.stat_metadata.items()}

    def value(s):
        return getattr(s, s.WhichOneof("value"))

    return line, [(names[e.metadata_id], e.offset_ps, e.duration_ps,
                   {stat_names[s.metadata_id]: value(s) for s in e.stats})
                  for e in line.events]


def test_the_import_hook_wrapped_tensorflows_profiler():
    from tensorflow.python.profiler import profiler_v2

    assert getattr(profiler_v2.start, profiler._WRAPPED, False)
    assert getattr(profiler_v2.stop, profiler._WRAPPED, False)
    assert tf.profiler.experimental.start is profiler_v2.start


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    """Two runs of a bridged step under tf.profiler.experimental.start/stop."""
    logdir = tmp_path_factory.mktemp("tf_profile")
    step, _ = _training_step()
    step(tf.constant(X))  # compiled before the session, as after a warm-up
    tf.profiler.experimental.start(str(logdir))
    try:
        for _ in range(2):
            step(tf.constant(X))
    finally:
        tf.profiler.experimental.stop()
    (exe,) = step.executables() if hasattr(step, "executables") else [
        p.executable for t in step._traces.values() for p in t.programs.values()]
    return logdir, exe


def test_tensorflows_xspace_holds_the_ipu_planes(profiled):
    logdir, exe = profiled
    (path,) = glob.glob(os.path.join(logdir, "plugins", "profile", "*", "*.xplane.pb"))
    space = xspace.read_xspace(path)
    names = [p.name for p in space.planes]
    # TensorFlow's own planes are kept, ours added: one XSpace, one timeline.
    assert "Task Environment" in names and names.count("/host:CPU") == 1
    assert IPU_PLANE in names
    host = next(p for p in space.planes if p.name == "/host:CPU")
    ipu = next(p for p in space.planes if p.name == IPU_PLANE)
    # (TensorFlow numbers all its planes 0; ours get ids of their own)
    assert ipu.id not in {p.id for p in space.planes if p.name != IPU_PLANE}

    pred = profile.prediction_of(exe)
    _, steps = _events(ipu, "Program steps")
    assert [e[3]["op"] for e in steps] == [s.name for s in pred.steps] * 2
    assert sum(e[3]["cycles"] for e in steps) == 2 * pred.cycles
    # Nodes keep their TensorFlow op names (the front end's sources).
    assert any("dense" in str(e[3].get("layer", "")) for e in steps)

    # The program runs on TensorFlow's clock, inside its session.
    line, runs = _events(host, THREAD)
    assert len(runs) == 2
    start = xspace.profile_start_ns(space)
    env = next(p for p in space.planes if p.name == "Task Environment")
    stop = next(s.uint64_value for s in env.stats
                if env.stat_metadata[s.metadata_id].name == "profile_stop_time")
    for _, offset_ps, dur_ps, _ in runs:
        begin_ns = line.timestamp_ns + offset_ps / 1000
        assert 0 < begin_ns and begin_ns + dur_ps / 1000 <= stop - start

    _, memory = _events(host, "IPU 0 memory activity (predicted)")
    assert max(e[3]["peak_bytes_in_use"] for e in memory) == profile.memory_of(exe).total_bytes


def test_trace_json_and_scalars_beside_it(profiled):
    logdir, exe = profiled
    (run_dir,) = glob.glob(os.path.join(logdir, "plugins", "profile", "*"))
    (trace,) = glob.glob(os.path.join(run_dir, "*.trace.json.gz"))
    with gzip.open(trace, "rt") as f:
        events = json.load(f)["traceEvents"]
    host_runs = [e for e in events
                 if e.get("pid") == tb.HOST_PID and e.get("name") == timeline.program_label(exe)]
    assert len(host_runs) == 2
    assert glob.glob(os.path.join(logdir, "events.out.tfevents.*"))


def test_the_plugins_converter_reads_the_merged_xspace(profiled):
    raw_to_tool_data = pytest.importorskip(
        "xprof.convert.raw_to_tool_data",
        reason="the profile plugin (tensorboard-plugin-profile, in the profile "
               "extra) is not installed")
    logdir, exe = profiled
    (path,) = glob.glob(os.path.join(logdir, "plugins", "profile", "*", "*.xplane.pb"))
    data, _ = raw_to_tool_data.xspace_to_tool_data(
        [path], "trace_viewer@", {"trace_viewer_options": {"resolution": 0}})
    trace = json.loads(data)
    processes = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"]
                 if e.get("name") == "process_name"}
    assert any(n.endswith(IPU_PLANE) for n in processes.values())
    data, _ = raw_to_tool_data.xspace_to_tool_data([path], "memory_profile", {})
    memory = json.loads(data)["memoryProfilePerAllocator"]
    peak = int(memory["IPU 0 (predicted)"]["profileSummary"]["peakStats"]["peakBytesInUse"])
    assert peak == profile.memory_of(exe).total_bytes


def test_profile_context_manager_and_a_session_without_ipu_runs(tmp_path):
    step, _ = _training_step()
    with tf.profiler.experimental.Profile(str(tmp_path / "with")):
        step(tf.constant(X))
    (path,) = glob.glob(str(tmp_path / "with" / "plugins" / "profile" / "*" / "*.xplane.pb"))
    assert IPU_PLANE in [p.name for p in xspace.read_xspace(path).planes]

    # No IPU program ran: TensorFlow's file is left as TensorFlow wrote it.
    tf.profiler.experimental.start(str(tmp_path / "none"))
    tf.reduce_sum(tf.ones((3, 3)))
    tf.profiler.experimental.stop()
    (path,) = glob.glob(str(tmp_path / "none" / "plugins" / "profile" / "*" / "*.xplane.pb"))
    assert IPU_PLANE not in [p.name for p in xspace.read_xspace(path).planes]
    assert not glob.glob(str(tmp_path / "none" / "plugins" / "profile" / "*" / "*.json.gz"))

    # Not saved: nothing of ours either, and the next session starts clean.
    tf.profiler.experimental.start(str(tmp_path / "unsaved"))
    step(tf.constant(X))
    tf.profiler.experimental.stop(save=False)
    assert not glob.glob(str(tmp_path / "unsaved" / "plugins" / "profile" / "*" / "*"))
    assert tb._trace is None


def test_autoreport_writes_a_report_per_tensorflow_program(tmp_path, monkeypatch):
    monkeypatch.setenv(profile.ENV_VAR, json.dumps(
        {"autoReport.all": "true", "autoReport.directory": str(tmp_path)}))
    step, _ = _training_step()
    step(tf.constant(X[:5]))  # a batch size of its own: compiled here, not cached
    (path,) = glob.glob(str(tmp_path / f"*{profile.SUFFIX}"))
    with open(path) as f:
        report = json.load(f)
    assert report["program"]["name"] == "step"
    assert report["memory"]["ipus"][0]["total"] > 0
    assert report["cycles"]["total"] > 0
    assert any("dense" in layer["layer"] for layer in report["cycles"]["layers"])


def test_keras_tensorboard_under_the_tensorflow_backend(tmp_path):
    """fit of a tf.keras model in an IPUStrategy scope with
    TensorBoard(profile_batch=(2, 3)) under KERAS_BACKEND=tensorflow: the
    XSpace TensorFlow writes holds the IPU plane of the two profiled
    batches' program runs (a subprocess: this session runs the ipu backend)."""
    import subprocess
    import sys

    script = os.path.join(os.path.dirname(__file__), "tensorboard_tf_scenario.py")
    env = dict(os.environ, KERAS_BACKEND="tensorflow", TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.run([sys.executable, script, str(tmp_path)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["on_ipu"]
    assert "/host:CPU" in result["planes"] and IPU_PLANE in result["planes"]
    assert result["runs"] == 2 and len(result["steps"]) == 2
    assert result["trace_json"]
