"""The profile as an XSpace (`<host>.xplane.pb`), the format the current
TensorBoard profile plugin (tensorboard-plugin-profile / xprof 2.19 and
later) reads.

Planes, as TensorFlow's profiler writes them and the plugin expects:

- "/host:CPU": one line for the Python thread, where each profiled batch is
  a step marker ("train" with the stats step_num and _r=1, as
  `tf.profiler.experimental.Trace("train", step_num=..., _r=1)` records
  it: the plugin's overview page finds its steps there) and each program
  run the simulator made inside it, in wall time; and, per IPU, a line of
  MemoryAllocation / MemoryDeallocation events at the predicted times of
  the program's steps (allocator "IPU n (predicted)"), which the plugin's
  memory profile reads.
- "/device:CUSTOM:IPU:n (predicted)", one per IPU: the lanes of
  report.timeline (program runs, host transfers, program steps with op,
  Keras layer and cycles as stats, loop bodies) and the memory counter.
  The plugin draws only the host, GPU, TPU and CUSTOM device planes (a
  plane named "/device:IPU:n" is dropped without a word), so the IPU
  planes use its CUSTOM prefix.

The XPlane protobuf classes come from TensorFlow (imported here only).
"""

import itertools

import numpy as np

from keras_ipu import _atomic_files
from keras_ipu.device.simulator import memory_model
from keras_ipu.device.simulator import profile
from keras_ipu.report import timeline
from keras_ipu.report.graph_def import TF_DTYPES

HOST_PLANE = "/host:CPU"
IPU_PLANE = "/device:CUSTOM:IPU:{ipu} (predicted)"
COUNTER_LINE = "_counters_"  # the plugin's name for counter (not slice) lines
STEP_MARKER = "train"  # the plugin's explicit host step marker
ALLOCATOR = "IPU {ipu} (predicted)"



def _xplane_pb2():
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    return xplane_pb2


class _MetadataIds:
    """`ids(name)`: the id of `name` in an XPlane's event or stat metadata
    map; a new name gets the next free id and its metadata entry."""

    def __init__(self, metadata):
        self._metadata = metadata
        self._ids = {m.name: k for k, m in metadata.items()}
        self._next = max(metadata.keys(), default=0) + 1

    def __call__(self, name):
        k = self._ids.get(name)
        if k is None:
            k = self._ids[name] = self._next
            self._next += 1
            m = self._metadata[k]
            m.id, m.name = k, name
        return k


class _Plane:
    """An XPlane being filled: metadata ids handed out on first use."""

    def __init__(self, plane, plane_id, name):
        self.plane = plane
        plane.id, plane.name = plane_id, name
        self.event_id = _MetadataIds(plane.event_metadata)
        self.stat_id = _MetadataIds(plane.stat_metadata)

    def set_stats(self, message, stats):
        for key, value in stats.items():
            if value is None:
                continue
            stat = message.stats.add()
            stat.metadata_id = self.stat_id(key)
            if isinstance(value, bool):
                stat.int64_value = int(value)
            elif isinstance(value, (int, np.integer)):
                stat.int64_value = int(value)
            elif isinstance(value, (float, np.floating)):
                stat.double_value = float(value)
            else:
                stat.str_value = str(value)

    def line(self, line_id, name, timestamp_ns):
        line = self.plane.lines.add()
        line.id = line.display_id = line_id
        line.name = line.display_name = name
        line.timestamp_ns = timestamp_ns
        return line

    def event(self, line, name, start_us, dur_us, stats=None):
        event = line.events.add()
        event.metadata_id = self.event_id(name)
        event.offset_ps = max(0, int(round(start_us * 1e6)))
        event.duration_ps = max(0, int(round(dur_us * 1e6)))
        if stats:
            self.set_stats(event, stats)
        return event


HOST_THREAD = "python (Keras fit: profiled batches, program runs)"


def build_xspace(hostname, wall0, origin, batches, runs, t0_ns=0,
                 thread_name=HOST_THREAD):
    """The XSpace of a finished trace. `wall0`: the trace's start (time.time()
    seconds); `origin`: the same instant in perf_counter seconds;
    `batches`: [(batch, start, end)]; `runs`: [(executable, start, end)]
    (perf_counter seconds). Times count from the trace's start, as
    TensorFlow's profiler normalizes them before saving (absolute
    nanoseconds overflow the plugin's picoseconds; the start itself is a
    stat of the host plane); `t0_ns`: where the trace's start lies on the
    clock of an XSpace this one is merged into (merge_xspace)."""
    pb = _xplane_pb2()
    space = pb.XSpace()
    space.hostnames.append(hostname)

    def us(t):
        return (t - origin) * 1e6

    host = _Plane(space.planes.add(), 0, HOST_PLANE)
    host.set_stats(host.plane, {"profile_start_time": int(wall0 * 1e9)})
    thread = host.line(1, thread_name, t0_ns)
    events = [(us(start), us(end) - us(start), STEP_MARKER,
               {"step_num": int(batch), "_r": 1}) for batch, start, end in batches]
    # Not named after the program: the plugin takes any event whose name
    # starts with "train" or "test" for a step marker.
    events += [(us(start), us(end) - us(start), f"simulator runs {timeline.program_label(exe)}",
                {"program": getattr(exe, "name", None) or "program",
                 "fingerprint": profile.program_fingerprint(exe),
                 "what": "the simulator running the program on the host (wall time)"})
               for exe, start, end in runs]
    # Parents before children: the plugin nests events of a line by time.
    for start, dur, name, stats in sorted(events, key=lambda e: (e[0], -e[1])):
        host.event(thread, name, start, dur, stats)

    slices, counters = timeline.lay_out(runs, origin)
    targets = {}
    for exe, _, _ in runs:
        targets.setdefault(0, profile.prediction_of(exe).target)
    ipus = sorted({s.ipu for s in slices} | set(targets))
    for ipu in ipus:
        plane = _Plane(space.planes.add(), 1 + ipu, IPU_PLANE.format(ipu=ipu))
        target = targets.get(ipu)
        if target is not None:
            plane.set_stats(plane.plane, {
                "target": f"{target.name} ({target.product}), predicted by keras_ipu",
                "clock_hz": float(target.clock_hz), "tiles": target.tiles_per_ipu,
                "memory_per_tile_bytes": target.sram_bytes_per_tile})
        lines = [plane.line(1 + k, name, t0_ns) for k, name in enumerate(timeline.LANES)]
        for s in slices:
            if s.ipu == ipu:
                plane.event(lines[s.lane], s.name, s.start_us, s.dur_us, s.args)
        counter_line = plane.line(len(lines) + 1, COUNTER_LINE, t0_ns)
        for c in counters:
            if c.ipu == ipu:
                plane.event(counter_line, c.name, c.ts_us, 0, c.values)
        memory_line = host.line(10 + ipu, f"IPU {ipu} memory activity (predicted)", t0_ns)
        _memory_activity(host, memory_line, runs, origin, ipu)
    return space


def _memory_activity(plane, line, runs, origin, ipu):
    """MemoryAllocation / MemoryDeallocation events of the first run of each
    program, at its predicted step times: the always-live memory by
    category at the run's start, each value a step makes where it is made,
    freed after its last reader, a loop body's peak during its step."""
    seen = set()
    slices, _ = timeline.lay_out(runs, origin)
    starts = [s for s in slices if s.lane == timeline.RUNS]
    address = itertools.count(1)  # an identity per allocation: the model has no addresses
    # One allocator, one high-water mark over all its programs: the plugin
    # reads the last event's peak as the lifetime peak.
    state = {"in_use": 0, "peak": 0}
    for (exe, _, _), run in zip(runs, starts):
        if id(exe) in seen:
            continue
        seen.add(id(exe))
        pred = profile.prediction_of(exe)
        target = pred.target
        program = memory_model.graph_of(exe)
        trace = profile.execution_trace(pred, None)
        us_per_cycle = 1e6 / target.clock_hz
        begin = run.start_us + timeline.transfer_seconds(pred)[0] * 1e6
        capacity = target.sram_bytes_per_ipu
        allocator = ALLOCATOR.format(ipu=ipu)

        def emit(kind, at, nbytes, op, region, aval=None, addr=0):
            state["in_use"] += nbytes if kind == "MemoryAllocation" else -nbytes
            state["peak"] = max(state["peak"], state["in_use"])
            plane.event(line, kind, at, 0, {
                "allocator_name": allocator, "bytes_allocated": state["in_use"],
                "bytes_reserved": 0, "bytes_available": max(0, capacity - state["in_use"]),
                "peak_bytes_in_use": state["peak"], "requested_bytes": nbytes,
                "allocation_bytes": nbytes, "addr": addr, "tf_op": op,
                "region_type": region,
                "data_type": TF_DTYPES.get(str(aval.dtype), 0) if aval is not None else None,
                "tensor_shape": (f"[{','.join(map(str, aval.shape))}]"
                                 if aval is not None else None)})

        resident = []
        held = memory_model.held_on(program, ipu)
        kept = set(held.inputs)
        categories = profile.input_categories(exe, program)
        for var, category in zip(program.inputs, categories):
            if var in kept:
                resident.append((next(address), var.aval.nbytes or 0, category, var.aval))
        for aval in held.constants:
            resident.append((next(address), aval.nbytes or 0, "constants", aval))
        mem = profile.memory_of(exe, target, ipu)
        resident.append((next(address), mem.code_bytes, "code", None))
        for addr, nbytes, category, aval in resident:
            emit("MemoryAllocation", begin, nbytes, category, category, aval, addr)

        addresses, live_before = {}, set()
        end = begin
        for (i, node, live, _, _, made, inner), step in zip(
                memory_model.liveness_by_step(program, target.tiles_per_ipu, ipu), trace):
            at = begin + step["start"] * us_per_cycle
            end = begin + step["end"] * us_per_cycle
            op = f"{node.source or timeline.NO_LAYER}/{node.primitive.name}"
            for k in live_before - live:
                aval = k.aval
                emit("MemoryDeallocation", at, aval.nbytes or 0, op, "activation",
                     aval, addresses.pop(k))
            for k in live - live_before:
                aval = k.aval
                addresses[k] = next(address)
                emit("MemoryAllocation", at, aval.nbytes or 0, op, "activation",
                     aval, addresses[k])
            if inner is not None and inner.ipu_bytes:
                addr = next(address)
                emit("MemoryAllocation", at, inner.ipu_bytes, op,
                     "loop body temporaries (peak)", None, addr)
                emit("MemoryDeallocation", end, inner.ipu_bytes, op,
                     "loop body temporaries (peak)", None, addr)
            live_before = set(live)
        for k in live_before:
            aval = k.aval
            emit("MemoryDeallocation", end, aval.nbytes or 0, "program end",
                 "activation", aval, addresses.pop(k))
        for addr, nbytes, category, aval in resident:
            emit("MemoryDeallocation", end, nbytes, "program end", category, aval, addr)


def read_xspace(path):
    space = _xplane_pb2().XSpace()
    with open(path, "rb") as f:
        space.ParseFromString(f.read())
    return space


def profile_start_ns(space):
    """When the profiling session of an XSpace TensorFlow's profiler wrote
    started (ns since the epoch: its "Task Environment" plane's
    profile_start_time), or None."""
    for plane in space.planes:
        names = {k: m.name for k, m in plane.stat_metadata.items()}
        for stat in plane.stats:
            if names.get(stat.metadata_id) == "profile_start_time":
                return int(getattr(stat, stat.WhichOneof("value")))
    return None


def merge_xspace(base, extra):
    """`base` with the planes of `extra` added: a plane both have by name
    (the host's) gets the other's lines, their event and stat metadata
    renumbered into its own; the others are appended with ids of their
    own. Returns `base`."""
    by_name = {p.name: p for p in base.planes}
    next_id = max((p.id for p in base.planes), default=-1) + 1
    for plane in extra.planes:
        into = by_name.get(plane.name)
        if into is None:
            added = base.planes.add()
            added.CopyFrom(plane)
            added.id = next_id
            next_id += 1
            continue
        _merge_lines(into, plane)
    for host in extra.hostnames:
        if host not in base.hostnames:
            base.hostnames.append(host)
    return base


def _merge_lines(into, plane):
    event_id, stat_id = _MetadataIds(into.event_metadata), _MetadataIds(into.stat_metadata)
    event_ids = {k: event_id(m.name) for k, m in plane.event_metadata.items()}
    stat_ids = {k: stat_id(m.name) for k, m in plane.stat_metadata.items()}
    line_id = max((x.id for x in into.lines), default=0) + 1
    for line in plane.lines:
        added = into.lines.add()
        added.CopyFrom(line)
        added.id = added.display_id = line_id
        line_id += 1
        for event in added.events:
            event.metadata_id = event_ids[event.metadata_id]
            for stat in event.stats:
                stat.metadata_id = stat_ids[stat.metadata_id]


def write_xspace(path, space):
    """Writes `space` to `path` atomically (a temporary file renamed)."""
    _atomic_files.write_bytes(path, space.SerializeToString())
    return path
