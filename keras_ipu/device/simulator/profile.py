"""Profile reports: one JSON file per compiled executable, as Poplar's
`autoReport` writes a profile per engine.

Turning it on (either is enough; the environment wins where both set an
option, as in Poplar):

    POPLAR_ENGINE_OPTIONS='{"autoReport.all":"true","autoReport.directory":"./reports"}'
    config.compilation_poplar_options = {"autoReport.all": "true", ...}

or an IPUConfig option whose value is an ExecutionProfileType other than
NO_PROFILE. Without `autoReport.directory` reports go to the current
directory, as Poplar's do. `python -m keras_ipu.report DIR` reads them.

Report schema (format_version 2). All cycles are predicted IPU cycles of
the target (cost_model); all bytes are predicted bytes (memory_model).
"Fullest tile", "peak step" and step time are memory_model's and
prediction's, the same numbers the out-of-memory error, the summary, the
pictures, the TensorBoard scalars and the trace show.

    {
      "format_version": 2,
      "kind": "keras_ipu.profile",
      "created": "2026-11-22T19:30:00Z",   # UTC, when the report was written
      "program": {"name", "fingerprint", "steps", "inputs", "outputs",
                  "input_bytes", "output_bytes", "constant_bytes"},
      "target": {"name", "product", "tiles_per_ipu", "memory_per_tile",
                 "memory_per_ipu", "clock_hz", "ipu_model"},
      "options": {"directory", "graph_profile", "execution_profile",
                  "execution_profile_type", "sources", "allow_out_of_memory"},
      "memory": null | {                     # null without a graph profile
        "ipus": [{"ipu", "always_live", "not_always_live", "total",
                  "capacity", "inputs", "constants", "code",
                  "categories": {category: bytes},   # CATEGORIES, non-zero ones
                  "peak_step", "peak_step_name", "fullest_tile",
                  "fullest_tile_bytes", "fits", "tiles_over_capacity",
                  "most_over_bytes"}],
        "tiles": [{"ipu", "capacity",         # one per IPU, bytes per tile at
                   "always_live": [int per tile], "total": [int per tile],  # the peak
                   "categories": {category: [int per tile]},
                   "fullest_tile", "fullest_tile_bytes"}],
        "largest_live": [{"bytes", "tensor", "made_by"}],   # the fullest IPU's:
        "tensors": [{"tensor", "bytes", "category", "made_by",  # in memory at
                     "tiles", "per_tile", "start"}]               # the peak
      },
      "liveness": null | {                   # one entry per program step,
        "ipu",                               # on the fullest IPU
        "not_always_live": [bytes live on the IPU during step i],
        "tile0": [how far those raise the fullest tile above the
                  always-live bytes' fullest (the key keeps its old name)],
        "always_live": int, "peak_step": int,
        "steps": [{"op", "source", "inside",  # its largest live values:
                   "live": [[tensor, bytes, made_by]]}],
        "bodies": [{"step", "op", "source", "steps", "peak",   # inside loops
                    "not_always_live": [bytes per body step], "details": [...]}]
      },
      "cycles": null | {                     # null without an execution profile
        "total", "compute", "exchange", "sync", "steps_per_run",
        "cycles_per_step", "step_seconds", "device_seconds",
        "samples_per_second" (or null), "batch_size" (or null),
        "ipus": [{"ipu", "cycles"}],         # each IPU's cycles per run
        "host": {"bytes_in", "bytes_out", "seconds", "seconds_in", "seconds_out"},
        "steps": [{"index", "op", "kind", "source", "tiles", "flops",
                   "macs", "compute", "exchange", "sync", "cycles"}],
        "ops": [{"op", "count", "compute", "exchange", "sync", "cycles"}],
        "layers": [{"layer", "count", "cycles"}]    # by Keras layer path
      },                    # ops/layers open control flow up: a scan body's
                            # ops count `length` times (count = runs)
      "execution_trace": null | [            # the predicted timeline, in order
        {"index", "op", "source", "start", "end", "bytes",  # of its outputs
         "compute": [start, end], "sync": [start, end],
         "exchange": [start, end],           # each superstep: compute, sync, exchange
         "loops": [{"repeat", "trace"}]}     # control flow only: one pass through
      ]                                      # each sub-graph, cycles from 0
    }

Layers: a step's source is the Keras layer (name scope) that traced it;
"metrics" are the metric updates, "device loop" the loop of
steps_per_execution steps itself, "gradient accumulation" the loop over a
step's micro-batches and its accumulators, the optimizer is its name scope
("sgd", "adam"); "(no layer)" is what remains (ops traced outside any layer
and name scope). Host transfers are not cycles: `cycles.host` has them, and
step_seconds = (device_seconds + host.seconds) / steps_per_run.

`ops` and `layers` are sorted by cycles, largest first; `steps` and
`execution_trace` are in program order.
"""

import dataclasses
import datetime
import difflib
import hashlib
import itertools
import json
import os
import threading

import numpy as np

from keras_ipu import _atomic_files
from keras_ipu.device.config import system_config
from keras_ipu.device.enums import ExecutionProfileType
from keras_ipu.device.primitives import cost_util
from keras_ipu.device.simulator import cost_model
from keras_ipu.device.simulator import feeds
from keras_ipu.device.simulator import memory_model
from keras_ipu.device.simulator import prediction as _prediction
from keras_ipu.device.simulator import tile_mapping

FORMAT_VERSION = 2
KIND = "keras_ipu.profile"
ENV_VAR = "POPLAR_ENGINE_OPTIONS"
SUFFIX = ".ipu_profile.json"
EXAMPLE = (
    "POPLAR_ENGINE_OPTIONS='{\"autoReport.all\":\"true\","
    "\"autoReport.directory\":\"./reports\"}'"
)

# Poplar's autoReport engine options. The simulator writes one report that
# holds the graph profile (memory, liveness) and the execution profile
# (cycles, trace); the other outputs have no counterpart and are accepted
# so that scripts written for Poplar keep working.
_BOOL_OPTIONS = (
    "autoReport.all",
    "autoReport.outputGraphProfile",
    "autoReport.outputExecutionProfile",
    "autoReport.outputLoweredVars",
    "autoReport.outputArchive",
    "autoReport.outputSerializedGraph",
    "autoReport.outputDebugInfo",
    "autoReport.streamAtEachRun",
)
_INT_OPTIONS = ("autoReport.executionProfileProgramRunCount",)
_STR_OPTIONS = ("autoReport.directory",)
KNOWN_OPTIONS = _BOOL_OPTIONS + _INT_OPTIONS + _STR_OPTIONS


class ProfileOptionsError(ValueError):
    pass


@dataclasses.dataclass(frozen=True)
class ReportOptions:
    directory: str
    graph_profile: bool
    execution_profile: bool
    execution_profile_type: ExecutionProfileType
    program_run_count: int = 2  # Poplar's default
    sources: tuple = ()  # where the options came from, for the report

    def to_json(self):
        return {
            "allow_out_of_memory": allow_out_of_memory(),
            "directory": self.directory,
            "graph_profile": self.graph_profile,
            "execution_profile": self.execution_profile,
            "execution_profile_type": self.execution_profile_type.name,
            "sources": list(self.sources),
        }


# -- reading the options ---------------------------------------------------------
def _option_error(origin, key, value, problem, fix):
    return ProfileOptionsError(
        f"{origin}: {problem} for {key!r} (got {value!r}). {fix} Example: {EXAMPLE}"
    )


def _parse_env(text):
    try:
        options = json.loads(text)
    except json.JSONDecodeError as e:
        raise ProfileOptionsError(
            f"{ENV_VAR} is not valid JSON ({e.msg} at character {e.pos}): "
            f"{text!r}. Write it as a JSON object of string values, e.g. {EXAMPLE}"
        ) from None
    if not isinstance(options, dict):
        raise ProfileOptionsError(
            f"{ENV_VAR} must be a JSON object of Poplar engine options, got "
            f"{type(options).__name__} {text!r}. For example: {EXAMPLE}"
        )
    return options


def _check_options(options, origin):
    """The autoReport options of `options` with their values parsed; other
    Poplar engine options (debug.*, opt.*, target.*) are not the profile's
    business and are left out."""
    parsed = {}
    for key, value in options.items():
        if not str(key).startswith("autoReport."):
            continue
        if key not in KNOWN_OPTIONS:
            close = difflib.get_close_matches(key, KNOWN_OPTIONS, n=1)
            hint = f"Did you mean {close[0]!r}? " if close else ""
            raise ProfileOptionsError(
                f"{origin}: unknown Poplar option {key!r}. {hint}Known autoReport "
                f"options: {', '.join(KNOWN_OPTIONS)}."
            )
        if key in _BOOL_OPTIONS:
            if isinstance(value, bool):
                parsed[key] = value
            elif isinstance(value, str) and value.strip().lower() in ("true", "false"):
                parsed[key] = value.strip().lower() == "true"
            else:
                raise _option_error(origin, key, value, "expected \"true\" or \"false\"",
                                    f"Set {key} to \"true\" or \"false\".")
        elif key in _INT_OPTIONS:
            try:
                parsed[key] = int(value)
                if parsed[key] < 0:
                    raise ValueError
            except (TypeError, ValueError):
                raise _option_error(origin, key, value, "expected a non-negative integer",
                                    f"Set {key} to a count such as \"2\".") from None
        else:
            if not isinstance(value, str) or not value:
                raise _option_error(origin, key, value, "expected a directory path",
                                    f"Set {key} to a directory such as \"./reports\".")
            parsed[key] = value
    return parsed


def _config_profile_type(config):
    """The ExecutionProfileType an IPUConfig option holds, if any."""
    to_dict = getattr(config, "to_dict", None)
    values = to_dict() if callable(to_dict) else {}
    for value in values.values():
        if isinstance(value, ExecutionProfileType):
            return value
    return None


def _current_config():
    # Never makes a system just to read options.
    return getattr(system_config.configured_system(), "config", None)


def report_options(environ=None, config=None):
    """The ReportOptions in force, or None when profiling is off.

    Sources: the IPUConfig (`compilation_poplar_options` and any option
    holding an ExecutionProfileType; default: the configured system's), then
    POPLAR_ENGINE_OPTIONS on top. Bad JSON or an unknown autoReport option
    raises ProfileOptionsError naming the value and the fix.
    """
    environ = os.environ if environ is None else environ
    config = _current_config() if config is None else config
    merged, sources = {}, []
    profile_type = None
    if config is not None:
        poplar = getattr(config, "to_dict", lambda: {})().get("compilation_poplar_options")
        if poplar:
            merged.update(_check_options(poplar, "IPUConfig.compilation_poplar_options"))
            sources.append("IPUConfig.compilation_poplar_options")
        profile_type = _config_profile_type(config)
        if profile_type not in (None, ExecutionProfileType.NO_PROFILE):
            sources.append(f"IPUConfig ExecutionProfileType.{profile_type.name}")
    text = environ.get(ENV_VAR, "")
    if text.strip():
        env = _check_options(_parse_env(text), ENV_VAR)
        if env:
            sources.append(ENV_VAR)
        merged.update(env)

    every = merged.get("autoReport.all", False)
    graph = merged.get("autoReport.outputGraphProfile", every)
    execution = merged.get("autoReport.outputExecutionProfile", every)
    if profile_type not in (None, ExecutionProfileType.NO_PROFILE):
        graph = execution = True
    if not (graph or execution):
        return None
    if profile_type in (None, ExecutionProfileType.NO_PROFILE):
        profile_type = (ExecutionProfileType.TILE_PROFILE if execution
                        else ExecutionProfileType.NO_PROFILE)
    return ReportOptions(
        directory=merged.get("autoReport.directory", "."),
        graph_profile=bool(graph),
        execution_profile=bool(execution),
        execution_profile_type=profile_type,
        program_run_count=merged.get("autoReport.executionProfileProgramRunCount", 2),
        sources=tuple(sources),
    )


ALLOW_OUT_OF_MEMORY = "debug.allowOutOfMemory"


def allow_out_of_memory(environ=None, config=None):
    """Whether Poplar's engine option debug.allowOutOfMemory is "true" (in
    IPUConfig.compilation_poplar_options or POPLAR_ENGINE_OPTIONS, the
    environment winning): a program that does not fit compiles anyway, so
    that its report shows where it overflows, and runs on the simulator."""
    environ = os.environ if environ is None else environ
    config = _current_config() if config is None else config
    value = None
    if config is not None:
        poplar = getattr(config, "to_dict", lambda: {})().get("compilation_poplar_options")
        if poplar and ALLOW_OUT_OF_MEMORY in poplar:
            value = (poplar[ALLOW_OUT_OF_MEMORY], "IPUConfig.compilation_poplar_options")
    text = environ.get(ENV_VAR, "")
    if text.strip():
        options = _parse_env(text)
        if ALLOW_OUT_OF_MEMORY in options:
            value = (options[ALLOW_OUT_OF_MEMORY], ENV_VAR)
    if value is None:
        return False
    raw, origin = value
    if isinstance(raw, bool):
        return raw
    if isinstance(raw, str) and raw.strip().lower() in ("true", "false"):
        return raw.strip().lower() == "true"
    raise _option_error(origin, ALLOW_OUT_OF_MEMORY, raw, 'expected "true" or "false"',
                        f'Set {ALLOW_OUT_OF_MEMORY} to "true" to compile programs that '
                        "do not fit, or \"false\".")


# -- building the report ---------------------------------------------------------
def program_fingerprint(exe):
    """A short structural digest: the same program gives the same name."""
    graph = memory_model.graph_of(exe)
    h = hashlib.sha256()
    for node in graph.nodes:
        h.update(node.primitive.name.encode())
        h.update(" ".join(v.aval.short() for v in node.inputs + node.outputs).encode())
        h.update(b"\x00")
    for v in graph.inputs:
        h.update(v.aval.short().encode())
    return h.hexdigest()[:10]


def liveness(exe, target, ipu=0):
    """(not-always-live bytes per step on IPU `ipu`, how far they raise its
    fullest tile above the always-live one's, peak step): memory_model's
    walk of the schedule, in-place results and the peak inside loop bodies
    included, so that the curve's maximum is the peak the memory report
    (and the out-of-memory check) names."""
    per_ipu, per_tile = [], []
    peak, peak_at = (0, 0), -1
    for i, _, _, ipu_bytes, tile_bytes, _, _ in memory_model.liveness_by_step(
        exe, target.tiles_per_ipu, ipu, feeds=_feeds_of(exe)
    ):
        per_ipu.append(ipu_bytes)
        per_tile.append(tile_bytes)
        # As the memory model ranks steps (tile_mapping.TileLoad): the
        # fullest tile, then the bytes in all.
        if (tile_bytes, ipu_bytes) > peak:
            peak, peak_at = (tile_bytes, ipu_bytes), i
    return per_ipu, per_tile, peak_at


# Memory categories, in the order the pictures stack them. The always-live
# ones come from the program's inputs (what the caller said they are:
# device_checks.workload(input_categories=...)), its constants and the code
# estimate; "activations" are the values the steps make (activations,
# gradients, temporaries), live at the peak.
STATE_CATEGORIES = ("weights", "optimizer state", "metric state")
CATEGORIES = STATE_CATEGORIES + ("stream buffers", "program inputs", "constants",
                                 "code", "activations")


def input_categories(exe, program=None):
    """The memory category of each program input: the workload's
    input_categories when the compiling caller gave them (the Keras
    trainers do; the TensorFlow front end's bridged programs split their
    variables, frontends/tensorflow/variable_categories.py), else
    "program inputs"."""
    program = program or memory_model.graph_of(exe)
    given = tuple((getattr(exe, "workload", None) or {}).get("input_categories") or ())
    n = len(program.inputs)
    if len(given) != n:
        return ("program inputs",) * n
    return tuple(c if c in CATEGORIES else "program inputs" for c in given)


def _feeds_of(exe):
    """The feeds.Feeds the memory model counted `exe` with (None: a Graph)."""
    if not hasattr(exe, "in_avals"):
        return None
    return feeds.feeds_of(exe, getattr(exe, "workload", None))


def _held_categories(program, categories, held):
    """[(input Var, category)] of the program inputs an IPU holds."""
    kept = set(held.inputs)
    return [(v, c) for v, c in zip(program.inputs, categories) if v in kept]


def _tile_categories(held_inputs, constants, peak, layout):
    """{category: int64 bytes per tile} at the tile peak (memory_model's
    layout: where each tensor and the code sit)."""
    tiles = layout.tiles
    per = {c: np.zeros(tiles, np.int64) for c in CATEGORIES}
    per["code"] += layout.code
    for v, category in held_inputs:
        per[category] += layout.vector(v, v.aval)  # a feed's: one element
    for k, aval in enumerate(constants):
        per["constants"] += layout.vector(("constant", k), aval)
    for t in peak.tensors:
        per["activations"] += tile_mapping.distribution(
            t.nbytes, t.aval.dtype.itemsize, tiles, t.start)
    return per


def step_details(program, tiles, top=5, ipu=0):
    """Per program step: its op, Keras layer and the `top` largest values
    live there on IPU `ipu` ([tensor, bytes, made by]), for the report's
    hover views."""
    out = []
    nodes = program.nodes
    for i, node, live, _, _, made, inner in memory_model.liveness_by_step(
            program, tiles, ipu):
        largest = sorted(live, key=lambda v: -(v.aval.nbytes or 0))[:top]
        out.append({
            "op": node.primitive.name, "source": node.source,
            "live": [[v.aval.short(), v.aval.nbytes or 0,
                      memory_model.made_by(nodes[made[v]], made[v])]
                     for v in largest],
            "inside": inner.name if inner is not None and inner.step >= 0 else None,
        })
    return out


def _peak_tensors(held_inputs, constants, peak, layout, top=200):
    """The tensors in memory at the tile peak, largest first: the program's
    inputs and constants (always live) and the values live there, each with
    its category and its linear mapping (`tiles` tiles from tile `start`,
    wrapping; bytes on each but the last), so a viewer can tell which of
    them a tile holds."""
    items = [(layout.aval(v, v.aval), category, "program input", layout.start(v))
             for v, category in held_inputs]
    items += [(aval, "constants", "program constant", layout.start(("constant", k)))
              for k, aval in enumerate(constants)]
    items += [(t.aval, "activations", t.made_by, t.start) for t in peak.tensors]
    items.sort(key=lambda x: -(x[0].nbytes or 0))
    out = []
    for aval, category, made_by, start in items[:top]:
        used, per_tile = cost_model.linear_mapping(aval.nbytes or 0, aval.dtype.itemsize,
                                                   layout.tiles)
        out.append({"tensor": aval.short(), "bytes": aval.nbytes or 0,
                    "category": category, "made_by": made_by,
                    "tiles": used, "per_tile": per_tile, "start": start})
    return out


def tile_memory(exe, target, program=None, peak=None, ipu=0):
    """{category: int64 bytes per tile} at the tile peak of `exe` on IPU
    `ipu` of `target`: what the per-tile picture stacks, and the overflow."""
    program = program or memory_model.graph_of(exe)
    tiles = target.tiles_per_ipu
    fed = _feeds_of(exe)
    peak = peak or memory_model.peak_liveness(program, tiles, ipu, feeds=fed)
    held = memory_model.held_on(program, ipu)
    return _tile_categories(_held_categories(program, input_categories(exe, program), held),
                            held.constants, peak,
                            memory_model.layout_on(program, tiles, ipu, held, fed))


def tile_overflow(exe, target, ipu=0):
    """(tiles over capacity, bytes the fullest is over, its bytes) at the
    peak on IPU `ipu`."""
    total = sum(tile_memory(exe, target, ipu=ipu).values())
    over = total - target.sram_bytes_per_tile
    return int(np.count_nonzero(over > 0)), int(max(over.max(initial=0), 0)), int(total.max())


def _memory_section(exe, mem, target):
    """The report's memory section (one entry per IPU in "ipus" and
    "tiles"; the largest tensors of the fullest IPU, `mem`) and its
    liveness section (the fullest IPU's steps)."""
    program = memory_model.graph_of(exe)
    tiles = target.tiles_per_ipu
    categories = input_categories(exe, program)
    by_ipu = getattr(exe, "memory_by_ipu", None) or {mem.ipu: mem}
    ipus, tile_pictures, tensors = [], [], []
    fed = _feeds_of(exe)
    for ipu in sorted(by_ipu):
        report = by_ipu[ipu]
        peak = memory_model.peak_liveness(program, tiles, ipu, feeds=fed)
        held = memory_model.held_on(program, ipu)
        held_inputs = _held_categories(program, categories, held)
        layout = memory_model.layout_on(program, tiles, ipu, held, fed)
        by_category = _tile_categories(held_inputs, held.constants, peak, layout)
        ipu_entry, tile_entry = _ipu_memory(report, target, held_inputs, by_category)
        ipus.append(ipu_entry)
        tile_pictures.append(tile_entry)
        if ipu == mem.ipu:
            tensors = _peak_tensors(held_inputs, held.constants, peak, layout)
    memory = {
        "ipus": ipus,
        "tiles": tile_pictures,
        "largest_live": [
            {"bytes": t.nbytes, "tensor": t.aval.short(), "made_by": t.made_by}
            for t in mem.largest_live
        ],
        "tensors": tensors,
    }
    per_ipu, per_tile, peak_at = liveness(exe, target, mem.ipu)
    live = {
        "ipu": mem.ipu,
        "not_always_live": per_ipu,
        "tile0": per_tile,
        "always_live": mem.always_live_bytes,
        "peak_step": peak_at,
        "steps": step_details(program, tiles, ipu=mem.ipu),
        "bodies": _body_liveness(program, target, ipu=mem.ipu),
    }
    return memory, live


def _ipu_memory(mem, target, held_inputs, by_category):
    """(the "ipus" entry, the "tiles" entry) of one IPU's MemoryReport."""
    always = sum(v for c, v in by_category.items() if c != "activations")
    total = always + by_category["activations"]
    fullest = int(np.argmax(total))
    capacity = target.sram_bytes_per_tile
    over = np.maximum(total - capacity, 0)
    ipu_categories = {c: 0 for c in CATEGORIES}
    for v, category in held_inputs:
        ipu_categories[category] += v.aval.nbytes or 0
    ipu_categories["constants"] = mem.constant_bytes
    ipu_categories["code"] = mem.code_bytes
    ipu_categories["activations"] = mem.not_always_live_bytes
    return {
        "ipu": mem.ipu,
        "always_live": mem.always_live_bytes,
        "not_always_live": mem.not_always_live_bytes,
        "total": mem.total_bytes,
        "capacity": target.sram_bytes_per_ipu,
        "inputs": mem.input_bytes,
        "constants": mem.constant_bytes,
        "code": mem.code_bytes,
        "categories": {c: v for c, v in ipu_categories.items() if v},
        "peak_step": mem.peak_step,
        "peak_step_name": mem.peak_step_name,
        "fullest_tile": mem.tile,
        "fullest_tile_bytes": mem.tile_bytes,
        "fits": mem.fits,
        "tiles_over_capacity": int(np.count_nonzero(over)),
        "most_over_bytes": int(over.max(initial=0)),
    }, {
        "ipu": mem.ipu,
        "capacity": capacity,
        "always_live": always.tolist(),
        "total": total.tolist(),
        "categories": {c: v.tolist() for c, v in by_category.items() if v.any()},
        "fullest_tile": fullest,
        "fullest_tile_bytes": int(total[fullest]),
    }


def _body_liveness(program, target, top=3, ipu=0):
    """Liveness inside the sub-graphs of control-flow steps (a device
    loop's training step is one scan step of the outer program): bytes the
    body's own values hold during each of its steps, largest bodies first."""
    bodies = []
    for i, node in enumerate(program.nodes):
        record = cost_util.node_cost(node)
        if record.kind == "cond":
            continue
        for part in record.parts:
            per_ipu, _, _ = liveness(part.graph, target, ipu)
            if per_ipu:
                bodies.append({"step": i, "op": node.primitive.name, "source": node.source,
                               "steps": len(per_ipu), "peak": max(per_ipu),
                               "not_always_live": per_ipu,
                               "details": step_details(part.graph, target.tiles_per_ipu,
                                                       ipu=ipu)})
    bodies.sort(key=lambda b: -b["peak"])
    return bodies[:top]


def execution_trace(prediction, program=None, depth=2, memo=None):
    """The predicted timeline of one run: each program step a superstep of
    compute, sync, exchange (DESIGN), one after another from cycle 0. A
    control-flow step also gets "loops": [{"repeat", "trace"}], the
    timeline of one pass through each sub-graph its cost counts
    (prediction.sub_predictions), cycles from 0, down to `depth` levels.
    `program`: the Executable/Graph (for the sub-graphs); `memo`: a dict
    the caller keeps while it draws many traces."""
    nodes = memory_model.graph_of(program).nodes if program is not None and depth > 0 else None
    memo = {} if memo is None else memo
    trace, t = [], 0
    for s in prediction.steps:
        c, y, e = t + s.compute, t + s.compute + s.sync, t + s.cycles
        entry = {
            "index": s.index, "op": s.name, "source": s.source, "ipu": s.ipu,
            "start": t, "end": e,
            "compute": [t, c], "sync": [c, y], "exchange": [y, e],
        }
        if nodes is not None:
            entry["bytes"] = sum(v.aval.nbytes or 0 for v in nodes[s.index].outputs)
        subs = (_prediction.sub_predictions(nodes[s.index], prediction.target, memo)
                if nodes is not None else [])
        if subs:
            entry["loops"] = [
                {"repeat": repeat, "trace": execution_trace(sub, graph, depth - 1, memo)}
                for repeat, graph, sub in subs
            ]
        trace.append(entry)
        t = e
    return trace


def flat_costs(prediction, program=None, repeat=1, source=None, depth=4, memo=None):
    """Leaf step costs of a run with control flow opened up: (op, source,
    count, compute, exchange, sync) each multiplied by how often it runs.
    They add up to prediction.cycles."""
    nodes = memory_model.graph_of(program).nodes if program is not None and depth > 0 else None
    memo = {} if memo is None else memo
    out = []
    for s in prediction.steps:
        src = s.source or source
        subs = (_prediction.sub_predictions(nodes[s.index], prediction.target, memo)
                if nodes is not None else [])
        if not subs:
            out.append((s.name, src, repeat, repeat * s.compute, repeat * s.exchange,
                        repeat * s.sync))
            continue
        for n, graph, sub in subs:
            out.extend(flat_costs(sub, graph, repeat * n, src, depth - 1, memo))
    return out


def layer_name(source):
    """The layer a step's cycles count for: its source; a fused step's
    ("a+a+b", one part per member) names each layer once ("a+b")."""
    if not source:
        return "(no layer)"
    return "+".join(dict.fromkeys(source.split("+")))


def _grouped(flat, key):
    groups = {}
    for item in flat:
        g = groups.setdefault(key(item), [0, 0, 0, 0])
        for j in range(4):
            g[j] += item[2 + j]
    return sorted(groups.items(), key=lambda kv: -(kv[1][1] + kv[1][2] + kv[1][3]))


def transfer_seconds(pred):
    """(seconds host -> IPU, seconds IPU -> host) of one run: they add up to
    pred.host_seconds (cost_model.host_transfer_seconds of each way)."""
    return (cost_model.host_transfer_seconds(pred.host_bytes_in, pred.target),
            cost_model.host_transfer_seconds(pred.host_bytes_out, pred.target))


def _cycles_section(pred, program=None):
    flat = flat_costs(pred, program)
    ops = [
        {"op": name, "count": n, "compute": c, "exchange": e, "sync": y,
         "cycles": c + e + y}
        for name, (n, c, e, y) in _grouped(flat, lambda x: x[0])
    ]
    layers = [
        {"layer": name, "count": n, "cycles": c + e + y}
        for name, (n, c, e, y) in _grouped(flat, lambda x: layer_name(x[1]))
    ]
    return {
        "total": pred.cycles,
        "compute": pred.compute_cycles,
        "exchange": pred.exchange_cycles,
        "sync": pred.sync_cycles,
        "steps_per_run": pred.steps_per_run,
        "cycles_per_step": pred.cycles_per_step,
        "step_seconds": pred.step_seconds,
        "device_seconds": pred.device_seconds,
        "samples_per_second": pred.samples_per_second,
        "batch_size": pred.batch_size,
        # Cycles each IPU works per run (a placed program's IPUs work side by
        # side, a copy on both ends); one IPU: all of them.
        "ipus": [{"ipu": int(k), "cycles": int(c)} for k, c in sorted(
            (getattr(pred, "ipu_cycles", None) or {0: pred.cycles}).items())],
        "pipeline": _pipeline_section(getattr(pred, "pipeline", None)),
        "host": {"bytes_in": pred.host_bytes_in, "bytes_out": pred.host_bytes_out,
                 "seconds": pred.host_seconds,
                 "seconds_in": transfer_seconds(pred)[0],
                 "seconds_out": transfer_seconds(pred)[1]},
        "steps": [
            {"index": s.index, "op": s.name, "kind": s.kind, "source": s.source,
             "tiles": s.tiles, "flops": s.flops, "macs": s.macs,
             "compute": s.compute, "exchange": s.exchange, "sync": s.sync,
             "cycles": s.cycles}
            for s in pred.steps
        ],
        "ops": ops,
        "layers": layers,
    }


def _pipeline_section(pipe):
    """A pipelined program's schedule (sharding.ShardedPrediction: what
    `total` follows), per IPU in pipeline order; None for other programs."""
    if pipe is None:
        return None
    return {
        "schedule": pipe.schedule,
        "micro_batches_per_step": pipe.gradient_accumulation_count,
        "steps_per_run": pipe.steps_per_run,
        "step_cycles": pipe.step_cycles,
        "utilisation": pipe.utilisation,
        "copy_bytes_per_micro_batch": pipe.copy_bytes,
        "ipus": [
            {"ipu": p.ipu, "stages": list(p.stages), "forward_cycles": p.forward_cycles,
             "backward_cycles": p.backward_cycles,
             "weight_update_cycles": p.weight_update_cycles,
             "offload_cycles": p.offload_cycles, "stash_bytes": p.stash_bytes,
             "in_flight": p.in_flight}
            for p in pipe.ipus
        ],
    }


def _target_of(exe):
    target = getattr(exe, "target", None)  # what the compiler compiled for
    if target is not None:
        return target
    for attr in ("memory", "_prediction", "prediction"):
        target = getattr(getattr(exe, attr, None), "target", None)
        if target is not None:
            return target
    return memory_model.resolve_target(None)


def memory_of(exe, target=None, ipu=None):
    """The MemoryReport of `exe` on IPU `ipu` (None: its fullest IPU) the
    compiler attached, else analysed now."""
    if ipu is not None:
        mem = (getattr(exe, "memory_by_ipu", None) or {}).get(ipu)
        return mem or memory_model.analyze_memory(exe, target or _target_of(exe), ipu)
    mem = getattr(exe, "memory", None)
    if mem is None:
        mem = getattr(getattr(exe, "prediction", None), "memory", None)
    if mem is None:
        mem = memory_model.analyze_memory(exe, target or _target_of(exe))
    return mem


def prediction_of(exe, target=None):
    """exe.prediction when the compiler attached it, else predicted now."""
    pred = getattr(exe, "prediction", None)
    if pred is None:
        pred = _prediction.predict_costs(exe, target or _target_of(exe), log=False)
    return pred


def _ipu_model():
    return system_config.configuration().ipu_model


def build_report(exe, options=None, name=None):
    """The report of `exe` as a JSON-ready dict (see the module doc)."""
    options = options or ReportOptions(".", True, True, ExecutionProfileType.TILE_PROFILE)
    return _build_report(exe, options, name)


def _build_report(exe, options, name):
    target = _target_of(exe)
    graph = memory_model.graph_of(exe)
    constants = memory_model.constants_of(graph)
    report = {
        "format_version": FORMAT_VERSION,
        "kind": KIND,
        "created": datetime.datetime.now(datetime.timezone.utc).strftime(
            "%Y-%m-%dT%H:%M:%S.%fZ"),
        "program": {
            "name": name or getattr(exe, "name", None) or "program",
            "fingerprint": program_fingerprint(exe),
            "steps": len(graph.nodes),
            "inputs": len(graph.inputs),
            "outputs": len(graph.outputs),
            "input_bytes": sum(v.aval.nbytes or 0 for v in graph.inputs),
            "output_bytes": sum(v.aval.nbytes or 0 for v in graph.outputs),
            "constant_bytes": sum(a.nbytes or 0 for a in constants),
        },
        "target": {
            "name": target.name,
            "product": target.product,
            "tiles_per_ipu": target.tiles_per_ipu,
            "memory_per_tile": target.sram_bytes_per_tile,
            "memory_per_ipu": target.sram_bytes_per_ipu,
            "clock_hz": target.clock_hz,
            "ipu_model": _ipu_model(),
        },
        "options": options.to_json(),
        "memory": None,
        "liveness": None,
        "cycles": None,
        "execution_trace": None,
    }
    if options.graph_profile:
        report["memory"], report["liveness"] = _memory_section(
            exe, memory_of(exe, target), target)
    if options.execution_profile:
        pred = prediction_of(exe, target)
        report["cycles"] = _cycles_section(pred, exe)
        report["execution_trace"] = execution_trace(pred, exe)
    return report


# -- writing it ------------------------------------------------------------------
_counter = itertools.count()
_write_lock = threading.Lock()


def _safe_name(name):
    kept = "".join(c if c.isalnum() or c in "-_" else "_" for c in str(name))
    return kept.strip("_")[:40] or "program"


def write_report(report, directory):
    """Writes `report` into `directory` atomically (a temporary file renamed
    into place); returns its path. Names never collide within a process
    (a counter) nor across processes (the pid)."""
    os.makedirs(directory, exist_ok=True)
    with _write_lock:
        n = next(_counter)
    program = report["program"]
    filename = (f"{_safe_name(program['name'])}_{os.getpid()}_{n:04d}_"
                f"{program['fingerprint']}{SUFFIX}")
    path = os.path.join(directory, filename)
    _atomic_files.write_bytes(
        path, json.dumps(report, separators=(",", ":")).encode("utf-8"))
    return path


def write_executable_report(exe, options=None, name=None):
    """Writes the report of a compiled Executable where the profile options
    say (report_options() when `options` is None); returns its path, or
    None when profiling is off."""
    options = report_options() if options is None else options
    if options is None:
        return None
    return write_report(build_report(exe, options, name), options.directory)


# -- runs, for traces (TensorBoard) ---------------------------------------------
# Listeners get (executable, wall start, wall end) after every run; the
# executor calls note_run. Empty unless a trace is on, so a run pays one
# truth test.
RUN_LISTENERS = []


def add_run_listener(fn):
    RUN_LISTENERS.append(fn)


def remove_run_listener(fn):
    if fn in RUN_LISTENERS:
        RUN_LISTENERS.remove(fn)


def note_run(exe, start=None, end=None):
    """Tells the listeners (a TensorBoard trace) that `exe` ran from `start`
    to `end` (time.perf_counter() seconds; now when omitted)."""
    if not RUN_LISTENERS:
        return
    import time

    end = time.perf_counter() if end is None else end
    start = end if start is None else start
    for fn in list(RUN_LISTENERS):
        fn(exe, start, end)
