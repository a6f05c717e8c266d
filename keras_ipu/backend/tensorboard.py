"""The profiler behind Keras' `TensorBoard(profile_batch=...)` on the ipu backend.

While a trace is on, every executable run is recorded (the run path calls
keras_ipu.device.simulator.profile.note_run). Stopping the trace with
save=True writes, under the log directory Keras passes (its train dir):

- `plugins/profile/<run>/<host>.xplane.pb`: an XSpace, what the current
  TensorBoard profile plugin (xprof) reads (report/xspace.py): the host
  plane with the profiled batches as step markers, and one plane per IPU
  with the predicted timeline (report/timeline.py: program runs, host
  transfers, program steps with op, Keras layer and cycles, loop bodies,
  memory).
- `plugins/profile/<run>/<host>.trace.json.gz`: the same as a Catapult
  (Chrome trace event) file, for plugin versions up to 2.18. Process
  "Host": the profiled batches and each executable run as the simulator ran
  it (wall time). Process "/device:IPU:0 (predicted)": the lanes of
  report/timeline.py.
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

from keras_ipu import _atomic_files
from keras_ipu.device.simulator import profile
from keras_ipu.report import timeline

HOST_PID, IPU_PID = 1, 2  # IPU n: IPU_PID + n

_lock = threading.Lock()
_trace = None


class _Trace:
    def __init__(self, logdir):
        self.logdir = logdir
        self.t0 = time.perf_counter()
        self.wall0 = time.time()
        self.runs = []  # (executable, start, end), perf_counter seconds
        self.batches = []  # (batch, start, end)
        self.run_dir = None  # TensorFlow's, when its profiler ran too

    def on_run(self, exe, start, end):
        self.runs.append((exe, start, end))


class _BatchTrace:
    def __init__(self, batch):
        self.batch = batch
        self.start = time.perf_counter()


def start_trace(logdir):
    """Starts recording executable runs (logdir "" only warms up, as Keras
    does before the first profiled batch). Returns the trace."""
    global _trace
    with _lock:
        if _trace is not None:
            raise RuntimeError(
                "An ipu profiler trace is already running: stop it with "
                "stop_trace() before starting another."
            )
        _trace = _Trace(logdir)
        profile.add_run_listener(_trace.on_run)
        return _trace


def take_trace(trace=None):
    """Stops recording and returns the trace (`trace`: only if it is the one
    running), or None."""
    global _trace
    with _lock:
        if _trace is None or (trace is not None and _trace is not trace):
            return None
        trace, _trace = _trace, None
    profile.remove_run_listener(trace.on_run)
    return trace


def stop_trace(save):
    """Stops the trace; with `save`, writes its files (see the module doc).
    Returns the trace file's path, or None."""
    trace = take_trace()
    if trace is None or not (save and trace.logdir):
        return None
    return save_trace(trace)


def save_trace(trace, tensorflow_dir=None):
    """Writes the files of a stopped trace; returns the trace JSON's path.
    `tensorflow_dir`: the run directory where TensorFlow's profiler wrote
    its `<host>.xplane.pb` for the same session (the TensorFlow front end,
    frontends/tensorflow/profiler.py): the IPU planes are merged into that
    file and the trace JSON goes beside it."""
    trace.run_dir = tensorflow_dir
    path = write_trace(trace)
    write_xspace(trace)
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


def _sort(pid, tid, index):
    kind = "thread_sort_index" if tid is not None else "process_sort_index"
    event = {"ph": "M", "pid": pid, "name": kind, "args": {"sort_index": index}}
    if tid is not None:
        event["tid"] = tid
    return event


def device_name(ipu, targets):
    return f"/device:IPU:{ipu} (predicted" + (
        f", {', '.join(sorted(targets))})" if targets else ")")


def trace_events(trace):
    """The Chrome trace events of a finished trace: the host's lanes, then
    per IPU the lanes of report.timeline (runs, host transfers, program
    steps, loop bodies) and its memory counter."""
    events = [
        _meta(HOST_PID, 0, "process_name", "Host"),
        _sort(HOST_PID, None, 0),
        _meta(HOST_PID, 1, "thread_name", "Profiled batches"),
        _meta(HOST_PID, 2, "thread_name", "Executable runs (simulator, wall time)"),
    ]
    for batch, start, end in trace.batches:
        events.append({"ph": "X", "pid": HOST_PID, "tid": 1,
                       "name": f"Profiled batch {batch}", "ts": _us(trace, start),
                       "dur": (end - start) * 1e6, "args": {"batch": batch}})
    for exe, start, end in trace.runs:
        events.append({"ph": "X", "pid": HOST_PID, "tid": 2,
                       "name": timeline.program_label(exe), "ts": _us(trace, start),
                       "dur": (end - start) * 1e6})
    slices, counters = timeline.lay_out(trace.runs, trace.t0)
    targets = {}
    for exe, _, _ in trace.runs:
        targets.setdefault(0, set()).add(profile.prediction_of(exe).target.name)
    for ipu in sorted({s.ipu for s in slices} | set(targets)):
        pid = IPU_PID + ipu
        events.append(_meta(pid, 0, "process_name", device_name(ipu, targets.get(ipu))))
        events.append(_sort(pid, None, 1 + ipu))
        for lane, name in enumerate(timeline.LANES):
            events.append(_meta(pid, 1 + lane, "thread_name", name))
            events.append(_sort(pid, 1 + lane, lane))
    for s in slices:
        events.append({"ph": "X", "pid": IPU_PID + s.ipu, "tid": 1 + s.lane,
                       "name": s.name, "ts": s.start_us, "dur": s.dur_us,
                       "args": s.args})
    for c in counters:
        events.append({"ph": "C", "pid": IPU_PID + c.ipu, "name": c.name,
                       "ts": c.ts_us, "args": c.values})
    return events


def run_directory(trace):
    """`<logdir>/plugins/profile/<run>`: where TensorBoard's profile plugin
    looks for the runs of a log directory (TensorFlow's, when its profiler
    wrote one for the same session)."""
    if trace.run_dir:
        return trace.run_dir
    run = time.strftime("%Y_%m_%d_%H_%M_%S", time.localtime(trace.wall0))
    return os.path.join(trace.logdir, "plugins", "profile", run)


def _host():
    return socket.gethostname() or "localhost"


def trace_path(trace):
    return os.path.join(run_directory(trace), f"{_host()}.trace.json.gz")


def xspace_path(trace):
    """Ours, or the one TensorFlow's profiler wrote in its run directory."""
    if trace.run_dir:
        written = sorted(name for name in os.listdir(trace.run_dir)
                         if name.endswith(".xplane.pb"))
        if written:
            return os.path.join(trace.run_dir, written[0])
    return os.path.join(run_directory(trace), f"{_host()}.xplane.pb")


def write_trace(trace):
    """The Chrome trace JSON (what plugin versions up to 2.18 read)."""
    path = trace_path(trace)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    document = {"displayTimeUnit": "ns", "traceEvents": trace_events(trace),
                "metadata": {"producer": "keras_ipu", "predicted": True}}
    with _atomic_files.atomic_path(path) as tmp:
        with gzip.open(tmp, "wt", encoding="utf-8") as f:
            json.dump(document, f)
    return path


def write_xspace(trace):
    """The XSpace (what plugin versions 2.19 and later, xprof, read); merged
    into TensorFlow's when its profiler wrote one for the same session."""
    from keras_ipu.report import xspace

    path = xspace_path(trace)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if trace.run_dir and os.path.exists(path):
        base = xspace.read_xspace(path)
        # On TensorFlow's clock: its times count from its session's start.
        start_ns = xspace.profile_start_ns(base)
        t0_ns = int(trace.wall0 * 1e9) - start_ns if start_ns else 0
        ours = xspace.build_xspace(
            base.hostnames[0] if base.hostnames else _host(), trace.wall0, trace.t0,
            trace.batches, trace.runs, t0_ns=max(t0_ns, 0),
            thread_name="keras_ipu program runs (simulator, wall time)")
        return xspace.write_xspace(path, xspace.merge_xspace(base, ours))
    space = xspace.build_xspace(_host(), trace.wall0, trace.t0, trace.batches, trace.runs)
    return xspace.write_xspace(path, space)


# -- scalars -------------------------------------------------------------------
# What each scalar is, with its unit: TensorBoard shows it beside the chart.
SCALAR_DESCRIPTIONS = {
    "ipu/predicted_cycles_per_step": "Predicted IPU cycles per training step (cycles; "
    "the program's cycles divided by the steps one run performs).",
    "ipu/predicted_step_time_us": "Predicted time per step (microseconds): device "
    "cycles at the target's clock plus the host transfers, divided by the steps per run.",
    "ipu/predicted_samples_per_second": "Predicted throughput (samples per second): "
    "batch size divided by the predicted step time.",
    "ipu/memory_total_bytes": "Predicted memory on the IPU at the peak (bytes): always "
    "live plus not always live.",
    "ipu/memory_not_always_live_bytes": "Predicted not-always-live memory at the peak "
    "step (bytes): the values the program's steps make.",
    "ipu/memory_fullest_tile_bytes": "Predicted bytes on the fullest tile at the peak "
    "(bytes; a tile holds 624 KiB on ipu2/ipu21, 256 KiB on ipu1).",
}


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
                tf.summary.scalar(tag, value, step=step,
                                  description=SCALAR_DESCRIPTIONS.get(tag))
    writer.flush()
    writer.close()
