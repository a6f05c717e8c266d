"""TensorBoard(profile_batch=...) on the ipu backend: the profiler functions,
the trace file TensorBoard's profile plugin reads, the scalars, the hook."""

import ast
import glob
import gzip
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from keras_ipu import _hook
from keras_ipu.backend import tensorboard as tb
from keras_ipu.device.compiler import compile_graph
from keras_ipu.device.ir import Graph
from keras_ipu.device.ir import Node
from keras_ipu.device.ir import ShapedArray
from keras_ipu.device.ir import Var
from keras_ipu.device.primitives import REGISTRY
from keras_ipu.device.simulator import profile
from keras_ipu.report import timeline


def tiny_executable():
    # y = exp(x) + x on f32[64].
    g = Graph()
    x = Var(ShapedArray((64,), "float32"))
    g.inputs = [x]
    a, b = Var(x.aval), Var(x.aval)
    g.nodes = [Node(REGISTRY["exp"], [x], {}, [a], "model/act"),
               Node(REGISTRY["add"], [a, x], {}, [b], "model/residual")]
    g.outputs = [b]
    return compile_graph(g)


def trace_files(logdir):
    return glob.glob(os.path.join(logdir, "plugins", "profile", "*", "*.trace.json.gz"))


def read_trace(path):
    with gzip.open(path, "rt") as f:
        return json.load(f)


@pytest.fixture(autouse=True)
def no_trace_left_running():
    yield
    if tb._trace is not None:
        tb.stop_trace(save=False)


def test_trace_records_runs_and_writes_a_catapult_file(tmp_path):
    exe = tiny_executable()
    exe.run(np.ones(64, np.float32))  # before the trace: not recorded
    tb.start_trace(str(tmp_path))
    ctx = tb.start_batch_trace(3)
    out = exe.run(np.ones(64, np.float32))
    exe.run(np.zeros(64, np.float32))
    tb.stop_batch_trace(ctx)
    path = tb.stop_trace(save=True)
    np.testing.assert_allclose(out[0], np.exp(1.0) + 1.0, rtol=1e-6)

    assert trace_files(tmp_path) == [path]
    assert os.path.basename(path).endswith(".trace.json.gz")
    events = read_trace(path)["traceEvents"]
    names = {e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert "Host" in names and any(n.startswith("/device:IPU:0 (predicted") for n in names)
    lanes = {e["tid"]: e["args"]["name"] for e in events
             if e["name"] == "thread_name" and e["pid"] == tb.IPU_PID}
    assert [lanes[t] for t in sorted(lanes)] == list(timeline.LANES)

    complete = [e for e in events if e["ph"] == "X"]
    batches = [e for e in complete if e["name"] == "Profiled batch 3"]
    assert len(batches) == 1

    def lane(name):
        tid = 1 + timeline.LANES.index(name)
        return [e for e in complete if e["pid"] == tb.IPU_PID and e["tid"] == tid]

    host_runs = [e for e in complete if e["pid"] == tb.HOST_PID and e["tid"] == 2]
    ipu_runs = lane("Program runs")
    assert len(host_runs) == len(ipu_runs) == 2  # the run before the trace is not there
    pred = profile.prediction_of(exe)
    device_us = pred.cycles / pred.target.clock_hz * 1e6
    # One truth: a run lasts the predicted step time times the steps per
    # run, host transfers included (they have a lane of their own).
    for run in ipu_runs:
        assert run["dur"] == pytest.approx(pred.step_seconds * pred.steps_per_run * 1e6)
        assert run["args"]["cycles"] == pred.cycles
    transfers = lane("Host transfers")
    assert [e["name"] for e in transfers] == ["host -> IPU", "IPU -> host"] * 2
    assert sum(e["dur"] for e in transfers[:2]) == pytest.approx(pred.host_seconds * 1e6)
    # The IPU runs one program at a time: the second starts after the first.
    assert ipu_runs[1]["ts"] >= ipu_runs[0]["ts"] + ipu_runs[0]["dur"] - 1e-6
    # Both runs' program steps, named by op and Keras layer, between the
    # transfers in and out.
    steps = lane("Program steps")
    assert [e["args"]["op"] for e in steps] == [s.name for s in pred.steps] * 2
    assert sum(e["dur"] for e in steps[: len(pred.steps)]) == pytest.approx(device_us)
    assert steps[0]["ts"] == pytest.approx(transfers[0]["ts"] + transfers[0]["dur"])
    if len(pred.steps) == 2:  # unfused: one step per op
        assert [e["args"]["layer"] for e in steps[:2]] == ["model/act", "model/residual"]
        assert steps[0]["name"] == "exp (model/act)"
    # Memory as a counter track: always live and not always live per step.
    counters = [e for e in events if e["ph"] == "C"]
    assert counters and counters[0]["name"] == "IPU 0 memory (predicted bytes)"
    mem = profile.memory_of(exe)
    assert counters[0]["args"]["always live"] == mem.always_live_bytes
    assert max(c["args"]["not always live"] for c in counters) == mem.not_always_live_bytes


def test_runs_after_the_first_two_say_their_steps_are_not_drawn(tmp_path):
    exe = tiny_executable()
    tb.start_trace(str(tmp_path))
    for _ in range(3):
        exe.run(np.ones(64, np.float32))
    events = read_trace(tb.stop_trace(save=True))["traceEvents"]
    runs = [e for e in events if e["ph"] == "X" and e["pid"] == tb.IPU_PID and e["tid"] == 1]
    assert [("steps not drawn" in e["name"]) for e in runs] == [False, False, True]
    assert "only the first 2 runs" in runs[2]["args"]["program steps drawn"]


def test_scalars_hold_predicted_cycles_and_memory(tmp_path):
    exe = tiny_executable()
    tb.start_trace(str(tmp_path))
    ctx = tb.start_batch_trace(5)
    exe.run(np.ones(64, np.float32))
    tb.stop_batch_trace(ctx)
    tb.stop_trace(save=True)

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    import tensorflow as tf

    files = glob.glob(os.path.join(tmp_path, "events.out.tfevents.*"))
    assert len(files) == 1
    acc = EventAccumulator(files[0], size_guidance={"tensors": 0})
    acc.Reload()
    expected = tb.scalar_values(exe)
    assert set(acc.Tags()["tensors"]) == set(expected)
    pred, mem = profile.prediction_of(exe), profile.memory_of(exe)
    assert expected["ipu/predicted_cycles_per_step"] == pred.cycles_per_step
    assert expected["ipu/memory_fullest_tile_bytes"] == mem.tile_bytes
    for tag, value in expected.items():
        assert tb.SCALAR_DESCRIPTIONS[tag] in acc.SummaryMetadata(tag).summary_description
        (event,) = acc.Tensors(tag)
        assert event.step == 5  # the profiled batch the run belongs to
        assert float(tf.make_ndarray(event.tensor_proto)) == pytest.approx(value, rel=1e-6)


def test_warm_up_and_unsaved_traces_write_nothing(tmp_path):
    exe = tiny_executable()
    tb.start_trace("")  # Keras warms the profiler up with an empty logdir
    exe.run(np.ones(64, np.float32))
    assert tb.stop_trace(save=False) is None
    tb.start_trace(str(tmp_path))
    exe.run(np.ones(64, np.float32))
    assert tb.stop_trace(save=False) is None
    assert os.listdir(tmp_path) == []
    assert not profile.RUN_LISTENERS  # nothing keeps listening
    assert tb.stop_trace(save=True) is None  # none running: nothing to stop


def test_second_trace_while_one_runs_is_an_error(tmp_path):
    tb.start_trace(str(tmp_path))
    with pytest.raises(RuntimeError, match="already running"):
        tb.start_trace(str(tmp_path))


# -- the hook: TensorBoard's backend check accepts "ipu" -----------------------
# (the installed module's tuple gets "ipu": tests/test_install_and_hook.py)
@pytest.mark.parametrize(
    "source",
    [
        "class Other:\n    pass\n",
        "class TensorBoard:\n    def on_epoch_end(self):\n        pass\n",
        textwrap.dedent(
            """
            class TensorBoard:
                def __init__(self, profile_batch=0):
                    if backend.backend() == "jax":
                        pass
            """
        ),
    ],
    ids=["no-class", "no-init", "no-backend-tuple"],
)
def test_changed_tensorboard_callback_names_supported_version(source):
    with pytest.raises(_hook.KerasVersionError) as info:
        _hook._patch_tensorboard_callback(ast.parse(source), _hook._TENSORBOARD_CALLBACK)
    message = str(info.value)
    assert "Keras 3.15" in message and _hook._TENSORBOARD_CALLBACK in message


FIT_SCRIPT = """
import glob, gzip, json, os, sys
import numpy as np
import keras
logdir = sys.argv[1]
model = keras.Sequential([keras.layers.Input((10, 10, 1)), keras.layers.Flatten(),
                          keras.layers.Dense(1)])
model.compile("sgd", "mse")
x, y = np.ones((10, 10, 10, 1)), np.ones((10, 1))
cb = keras.callbacks.TensorBoard(logdir, histogram_freq=1, profile_batch=1,
                                 write_graph=False)
model.fit(x, y, batch_size=2, epochs=2, validation_data=(x, y), callbacks=[cb],
          verbose=0)
traces = glob.glob(os.path.join(logdir, "train", "plugins", "profile", "*",
                                "*.trace.json.gz"))
events = json.load(gzip.open(traces[0], "rt"))["traceEvents"] if traces else []
print(json.dumps({"traces": len(traces), "events": len(events),
                  "ipu_runs": sum(1 for e in events if e.get("pid") == 2
                                  and e.get("tid") == 1 and e["ph"] == "X")}))
"""


def test_fit_with_profile_batch_writes_a_trace(tmp_path):
    env = dict(os.environ, KERAS_BACKEND="ipu", TF_CPP_MIN_LOG_LEVEL="3")
    env.pop(profile.ENV_VAR, None)
    proc = subprocess.run(
        [sys.executable, "-c", FIT_SCRIPT, str(tmp_path)],
        env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "Profiling is not yet available" not in proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["traces"] == 1
    assert result["ipu_runs"] == 1  # profile_batch=1: one train step traced
    assert result["events"] > 6
