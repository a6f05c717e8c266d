"""The profiler behind Keras' `TensorBoard(profile_batch=...)` on the ipu backend.

While a trace is on, every executable run is recorded (the run path calls
keras_ipu.device.simulator.profile.note_run). Stopping the trace with
save=True writes, under the log directory Keras passes (its train dir):

- `plugins/profile/<run>/<host>.trace.json.gz`: a Catapult (Chrome trace
  event) file, where TensorBoard's profile plugin looks for traces. Process
  "Host": the profiled batches and each executable run as the simulator ran
  it (wall time). Process "/device:IPU:0 (predicted)": each run at the
  predicted length, and its program steps as the cost model lays them out
  (compute, sync, exchange per step; op and Keras layer in the args).
- scalar summaries (tf.summary, so TensorFlow is imported here only):
  predicted cycles per step, step time, samples/s, and memory (IPU total,
  not-always-live peak, fullest tile), per executable run.
"""

import gzip
import json
import os
import socket
import threading
import time

from keras_ipu.device.simulator import profile

# Program steps are drawn for the first runs of each executable only, as
# Poplar's autoReport.executionProfileProgramRunCount (default 2) does;
# later runs appear as one event each.
STEP_DETAIL_RUNS = 2
HOST_PID, IPU_PID = 1, 2
# Program-step events per run at most (a device loop of many iterations
# would otherwise make a file TensorBoard cannot open).
MAX_STEP_EVENTS = 20000

_lock = threading.Lock()
_trace = None


class _Trace:
    def __init__(self, logdir):
        self.logdir = logdir
        self.t0 = time.perf_counter()
        self.wall0 = time.time()
        self.runs = []  # (executable, start, end), perf_counter seconds
        self.batches = []  # (batch, start, end)

    def on_run(self, exe, start, end):
        self.runs.append((exe, start, end))


class _BatchTrace:
    def __init__(self, batch):
        self.batch = batch
        self.start = time.perf_counter()


def start_trace(logdir):
    """Starts recording executable runs (logdir "" only warms up, as Keras
    does before the first profiled batch)."""
    global _trace
    with _lock:
        if _trace is not None:
            raise RuntimeError(
                "An ipu profiler trace is already running: stop it with "
                "stop_trace() before starting another."
            )
        _trace = _Trace(logdir)
        profile.add_run_listener(_trace.on_run)


def stop_trace(save):
    """Stops the trace; with `save`, writes its files (see the module doc).
    Returns the trace file's path, or None."""
    global _trace
    with _lock:
        trace, _trace = _trace, None
    if trace is None:
        return None
    profile.remove_run_listener(trace.on_run)
    if not (save and trace.logdir):
        return None
    path = write_trace(trace)
    write_scalars(trace)
    return path


def start_batch_trace(batch):
    return _BatchTrace(batch)


def stop_batch_trace(batch_trace_context):
    trace = _trace
    if trace is not None and batch_trace_context is not None:
        trace.batches.append(
            (batch_trace_context.batch, batch_trace_context.start, time.perf_counter())
        )


# -- the Catapult trace -------------------------------------------------------
def _us(trace, t):
    return (t - trace.t0) * 1e6


def _meta(pid, tid, kind, name):
    return {"ph": "M", "pid": pid, "tid": tid, "name": kind, "args": {"name": name}}


def _label(exe):
    name = getattr(exe, "name", None) or "program"
    return f"{name} ({profile.program_fingerprint(exe)})"


def trace_events(trace):
    """The Chrome trace events of a finished trace."""
    target_names = set()
    events = [
        _meta(HOST_PID, 0, "process_name", "Host"),
        _meta(HOST_PID, 1, "thread_name", "Profiled batches"),
        _meta(HOST_PID, 2, "thread_name", "Executable runs (simulator, wall time)"),
        _meta(IPU_PID, 1, "thread_name", "Program runs"),
        _meta(IPU_PID, 2, "thread_name", "Program steps"),
        _meta(IPU_PID, 3, "thread_name", "Loop and call bodies"),
        _meta(IPU_PID, 4, "thread_name", "Nested bodies"),
    ]
    for batch, start, end in trace.batches:
        events.append({"ph": "X", "pid": HOST_PID, "tid": 1,
                       "name": f"Profiled batch {batch}", "ts": _us(trace, start),
                       "dur": (end - start) * 1e6, "args": {"batch": batch}})
    detailed = {}
    known = {}  # id(executable) -> (label, prediction): once per program
    device_free = 0.0  # the IPU runs one program at a time
    for exe, start, end in trace.runs:
        if id(exe) not in known:
            known[id(exe)] = (_label(exe), profile.prediction_of(exe))
        label, pred = known[id(exe)]
        events.append({"ph": "X", "pid": HOST_PID, "tid": 2, "name": label,
                       "ts": _us(trace, start), "dur": (end - start) * 1e6})
        target = pred.target
        target_names.add(target.name)
        us_per_cycle = 1e6 / target.clock_hz
        begin = max(_us(trace, start), device_free)
        duration = pred.cycles * us_per_cycle
        device_free = begin + duration
        events.append({
            "ph": "X", "pid": IPU_PID, "tid": 1, "name": label, "ts": begin,
            "dur": duration,
            "args": {"cycles": pred.cycles, "steps": len(pred.steps),
                     "target": target.name},
        })
        seen = detailed.get(id(exe), 0)
        detailed[id(exe)] = seen + 1
        if seen >= STEP_DETAIL_RUNS:
            continue
        budget = [MAX_STEP_EVENTS]
        _step_events(events, profile.execution_trace(pred, exe), begin, us_per_cycle,
                     tid=2, budget=budget)
    profile._graph_predictions.clear()
    name = "/device:IPU:0 (predicted" + (
        f", {', '.join(sorted(target_names))})" if target_names else ")")
    events.insert(0, _meta(IPU_PID, 0, "process_name", name))
    return events


def _step_events(events, steps, origin, us_per_cycle, tid, budget):
    """Events of predicted program steps starting at `origin` (us); loop
    bodies are laid out pass after pass on the next lane."""
    for step in steps:
        if budget[0] <= 0:
            return
        if step["end"] == step["start"]:
            continue
        c, y, e = (b - a for a, b in (step["compute"], step["sync"], step["exchange"]))
        events.append({
            "ph": "X", "pid": IPU_PID, "tid": tid, "name": step["op"],
            "ts": origin + step["start"] * us_per_cycle,
            "dur": (step["end"] - step["start"]) * us_per_cycle,
            "args": {"step": step["index"], "layer": step["source"] or "",
                     "compute cycles": c, "sync cycles": y, "exchange cycles": e},
        })
        budget[0] -= 1
        at = origin + step["start"] * us_per_cycle
        for loop in step.get("loops", ()):
            length = max((x["end"] for x in loop["trace"]), default=0) * us_per_cycle
            for _ in range(loop["repeat"]):
                if budget[0] <= 0 or not length:
                    break
                _step_events(events, loop["trace"], at, us_per_cycle, tid + 1, budget)
                at += length


def trace_path(trace):
    run = time.strftime("%Y_%m_%d_%H_%M_%S", time.localtime(trace.wall0))
    host = socket.gethostname() or "localhost"
    return os.path.join(trace.logdir, "plugins", "profile", run, f"{host}.trace.json.gz")


def write_trace(trace):
    path = trace_path(trace)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    document = {"displayTimeUnit": "ns", "traceEvents": trace_events(trace),
                "metadata": {"producer": "keras_ipu", "predicted": True}}
    tmp = path + ".tmp"
    with gzip.open(tmp, "wt", encoding="utf-8") as f:
        json.dump(document, f)
    os.replace(tmp, path)
    return path


# -- scalars -------------------------------------------------------------------
def scalar_values(exe):
    """{tag: value} of one executable's predicted cycles and memory."""
    pred = profile.prediction_of(exe)
    mem = profile.memory_of(exe)
    values = {
        "ipu/predicted_cycles_per_step": float(pred.cycles_per_step),
        "ipu/predicted_step_time_us": pred.step_seconds * 1e6,
        "ipu/memory_total_bytes": float(mem.total_bytes),
        "ipu/memory_not_always_live_bytes": float(mem.not_always_live_bytes),
        "ipu/memory_fullest_tile_bytes": float(mem.tile_bytes),
    }
    if pred.samples_per_second:
        values["ipu/predicted_samples_per_second"] = float(pred.samples_per_second)
    return values


def _step_of(trace, index, start):
    for batch, b_start, b_end in trace.batches:
        if b_start <= start <= b_end:
            return int(batch)
    return index


def write_scalars(trace):
    """One value per tag per run, at the batch the run belongs to."""
    if not trace.runs:
        return
    import tensorflow as tf  # only here: the backend never needs it

    values = {}
    writer = tf.summary.create_file_writer(trace.logdir)
    with writer.as_default():
        for index, (exe, start, _) in enumerate(trace.runs):
            step = _step_of(trace, index, start)
            if id(exe) not in values:
                values[id(exe)] = scalar_values(exe)
            for tag, value in values[id(exe)].items():
                tf.summary.scalar(tag, value, step=step)
    writer.flush()
    writer.close()
