"""The IPU memory model of a single-IPU program: always-live and
not-always-live bytes, per IPU and per tile, and the out-of-memory error.

Every tensor is mapped linearly over the tiles with Poplar's default grain
(cost_model.linear_mapping: 8-byte grains, at least 128 bytes per tile,
from tile 0 up [POPUTIL]). Tile 0 then holds the largest share of every
tensor, so it is the fullest tile: the model reports it.

Always live: the program's inputs (weights, optimizer state and the stream
buffers of the data fed in), its constants, and the code estimate.
Not always live: the values made by the program's steps, from their step
to their last use (graph outputs to the end); the peak over the schedule.
"""

import dataclasses

from keras_ipu.device.config import system_config
from keras_ipu.device.ir import Graph
from keras_ipu.device.ir import Literal
from keras_ipu.device.simulator import cost_model
from keras_ipu.device.simulator import targets as _targets
from keras_ipu.device.units import fmt_bytes as _fmt_bytes


@dataclasses.dataclass(frozen=True)
class Step:
    """One program step, from a Graph node or an Executable record."""

    primitive: object
    params: dict
    inputs: tuple  # keys of the values read
    outputs: tuple  # keys of the values made
    in_avals: tuple
    out_avals: tuple
    source: object = None  # the Keras layer path, when the trace knew it


@dataclasses.dataclass(frozen=True)
class Program:
    steps: tuple
    inputs: tuple  # (key, aval)
    constants: tuple  # (key, aval)
    outputs: tuple  # keys


def program_of(obj):
    """The step list of a Graph or of a compiled Executable."""
    if isinstance(obj, Program):
        return obj
    if isinstance(obj, Graph):
        return _from_graph(obj)
    if hasattr(obj, "records") and hasattr(obj, "input_slots"):
        return _from_executable(obj)
    raise TypeError(
        f"Cannot cost {type(obj).__name__}: pass a keras_ipu Graph or an "
        "Executable (keras_ipu.device.compiler.compile_graph(graph))."
    )


def _from_graph(graph):
    consts = {}

    def key(v):
        if type(v) is Literal:
            k = ("const", id(v.value))
            consts.setdefault(k, v.aval)
            return k
        return v

    steps = tuple(
        Step(n.primitive, n.params, tuple(map(key, n.inputs)),
             tuple(n.outputs), tuple(v.aval for v in n.inputs),
             tuple(v.aval for v in n.outputs), n.source)
        for n in graph.nodes
    )
    outputs = tuple(map(key, graph.outputs))
    return Program(steps, tuple((v, v.aval) for v in graph.inputs),
                   tuple(consts.items()), outputs)


def _from_executable(exe):
    from keras_ipu.device.ir import ShapedArray

    sources = getattr(exe, "sources", None) or (None,) * len(exe.records)
    steps = tuple(
        Step(prim, params, ins, outs, in_avals, out_avals, source)
        for (prim, params, ins, outs, _frees, in_avals, out_avals), source in zip(
            exe.records, sources
        )
    )
    inputs = tuple(zip(exe.input_slots, exe.in_avals))
    constants = tuple(
        (s, ShapedArray(c.shape, c.dtype)) for s, c in exe.constants.items()
    )
    return Program(steps, inputs, constants, tuple(exe.output_slots))


def _nbytes(aval):
    return aval.nbytes or 0


def tile_bytes(aval, tiles):
    """Bytes of `aval` on its fullest tile (tile 0) under linear mapping."""
    return cost_model.linear_mapping(_nbytes(aval), aval.dtype.itemsize, tiles)[1]


@dataclasses.dataclass
class LiveTensor:
    nbytes: int
    aval: object
    made_by: str  # Keras layer path, else the primitive (and step)

    def describe(self):
        return f"{self.aval.short():<20} {_fmt_bytes(self.nbytes):>11}  {self.made_by}"


@dataclasses.dataclass
class MemoryReport:
    target: object
    ipu: int
    tiles: int
    always_live_bytes: int  # per IPU
    input_bytes: int
    constant_bytes: int
    code_bytes: int  # per IPU
    not_always_live_bytes: int  # peak, per IPU
    peak_step: int  # index of the step at the peak (-1: before the first)
    peak_step_name: str
    tile: int  # the fullest tile
    tile_bytes: int  # its peak bytes (always + not-always live)
    tile_always_live_bytes: int
    largest_live: list  # LiveTensor, largest first, at the tile peak

    @property
    def total_bytes(self):
        return self.always_live_bytes + self.not_always_live_bytes

    @property
    def tile_capacity(self):
        return self.target.sram_bytes_per_tile

    @property
    def fits(self):
        return self.tile_bytes <= self.tile_capacity

    def __str__(self):
        t = self.target
        lines = [
            f"Memory report: IPU {self.ipu} ({t.name}, {self.tiles} tiles x "
            f"{_fmt_bytes(t.sram_bytes_per_tile)})",
            f"  always live:      {_fmt_bytes(self.always_live_bytes):>11}  "
            f"(inputs {_fmt_bytes(self.input_bytes)}, constants "
            f"{_fmt_bytes(self.constant_bytes)}, code {_fmt_bytes(self.code_bytes)})",
            f"  not always live:  {_fmt_bytes(self.not_always_live_bytes):>11}  "
            f"(peak at step {self.peak_step}: {self.peak_step_name})",
            f"  total:            {_fmt_bytes(self.total_bytes):>11}  of "
            f"{_fmt_bytes(t.sram_bytes_per_tile * self.tiles)}",
            f"  fullest tile:     tile {self.tile}, {_fmt_bytes(self.tile_bytes)} of "
            f"{_fmt_bytes(t.sram_bytes_per_tile)} "
            f"({100.0 * self.tile_bytes / t.sram_bytes_per_tile:.1f}%)",
        ]
        if self.largest_live:
            lines.append("  largest live tensors at the peak:")
            lines.extend("    " + x.describe() for x in self.largest_live)
        return "\n".join(lines)


class IPUOutOfMemoryError(RuntimeError):
    """A program does not fit in the memory of a tile. `.report` holds the
    MemoryReport (written even so, as Poplar's IPU Model does)."""

    def __init__(self, report, advice=None):
        from keras_ipu.device.simulator import memory_remedies

        self.report = report
        self.advice = advice
        r = report
        over = r.tile_bytes - r.tile_capacity
        tensors = "\n".join("    " + x.describe() for x in r.largest_live) or "    (none)"
        super().__init__(
            f"Out of memory on IPU {r.ipu}, tile {r.tile}: it needs "
            f"{_fmt_bytes(r.tile_bytes)} but an {r.target.name} tile has "
            f"{_fmt_bytes(r.tile_capacity)} ({_fmt_bytes(over)} over). "
            f"Peak liveness at program step {r.peak_step} ({r.peak_step_name}); "
            f"always live {_fmt_bytes(r.always_live_bytes)}, not always live "
            f"{_fmt_bytes(r.not_always_live_bytes)} on the IPU.\n"
            f"  Largest live tensors:\n{tensors}\n"
            + memory_remedies.describe(report, advice)
        )


class IPUOutOfMemoryWarning(UserWarning):
    """A program that does not fit was compiled anyway (Poplar's engine
    option debug.allowOutOfMemory): the simulator runs it, a real IPU
    could not."""


def _made_by(step, index):
    if step is None:
        return "program input"
    if step.source:
        return f"{step.source} ({step.primitive.name}, step {index})"
    return f"{step.primitive.name} (step {index})"


def analyze_memory(obj, target=None, ipu=0, top=5):
    """The MemoryReport of a Graph or Executable on one IPU of `target`
    (an IPUTarget or its name; default: the current system's)."""
    target = resolve_target(target)
    program = program_of(obj)
    tiles = target.tiles_per_ipu
    steps = program.steps
    end = len(steps)

    input_bytes = sum(_nbytes(a) for _, a in program.inputs)
    constant_bytes = sum(_nbytes(a) for _, a in program.constants)
    code_tile = cost_model.code_bytes_per_tile(end)
    always_tile = code_tile
    for _, aval in program.inputs + program.constants:
        always_tile += tile_bytes(aval, tiles)

    peak = _liveness(program, tiles)
    peak_at, peak_ipu, peak_tile = peak.step, peak.ipu_bytes, peak.tile_bytes
    candidates = (
        list(peak.tensors)
        + [LiveTensor(_nbytes(a), a, "program input") for _, a in program.inputs]
        # Values a traced function closed over (weights under jit) are
        # constants of the program.
        + [LiveTensor(_nbytes(a), a, "program constant") for _, a in program.constants]
    )
    candidates.sort(key=lambda x: -x.nbytes)
    peak_name = peak.name
    code_ipu = code_tile * tiles
    return MemoryReport(
        target=target, ipu=ipu, tiles=tiles,
        always_live_bytes=input_bytes + constant_bytes + code_ipu,
        input_bytes=input_bytes, constant_bytes=constant_bytes, code_bytes=code_ipu,
        not_always_live_bytes=peak_ipu, peak_step=peak_at, peak_step_name=peak_name,
        tile=0, tile_bytes=always_tile + peak_tile, tile_always_live_bytes=always_tile,
        largest_live=candidates[:top],
    )


@dataclasses.dataclass
class _Peak:
    ipu_bytes: int  # not-always-live bytes on the IPU at the peak
    tile_bytes: int  # ... on the fullest tile
    step: int  # outer step index of the peak (-1: none)
    name: str  # the step's primitive and layer (and the inner step's)
    tensors: tuple  # LiveTensor of the values live at the peak


def _subprograms(step):
    """The graphs a control-flow step runs (branches, loop bodies, ...)."""
    found = []
    for value in step.params.values():
        if isinstance(value, Graph):
            found.append(value)
        elif isinstance(value, tuple) and value and all(
            isinstance(v, Graph) for v in value
        ):
            found.extend(value)
    return found


def _inner_peak(step, tiles):
    """The not-always-live peak inside a control-flow step's sub-graphs.
    A loop body's temporaries exist once (each iteration frees them), so
    the step needs the largest of its sub-graphs' peaks on top of what is
    live outside it."""
    best = None
    for graph in _subprograms(step):
        peak = _liveness(_from_graph(graph), tiles)
        if best is None or peak.tile_bytes > best.tile_bytes:
            best = peak
    return best


def dying_at(program):
    """step index -> keys of the values whose last use is that step (values
    never read die where they are made; program outputs live to the end,
    index len(steps))."""
    steps = program.steps
    last = {}
    for i, st in enumerate(steps):
        for k in st.inputs:
            last[k] = i
        for k in st.outputs:
            last.setdefault(k, i)
    for k in program.outputs:
        last[k] = len(steps)
    dying = {}
    for k, i in last.items():
        dying.setdefault(i, []).append(k)
    return dying


def live_steps(program, tiles):
    """Walks the schedule of `program`: yields (step index, step, keys live,
    their bytes on the IPU, on tile 0, {key: (aval, step made)}) at each
    step, the step's results live and the values it reads last not yet
    freed. A result computed in place (_in_place) takes over its operand's
    memory: not-always-live bytes pass to it, and one written into an
    input stays in always-live memory. The yielded set is the walker's
    own: copy it to keep it."""
    steps = program.steps
    dying = dying_at(program)
    constants = {k for k, _ in program.constants}
    # Values held in always-live memory: the inputs, and what was computed
    # in place into them (a weight update, a loop's carried state).
    resident = {k for k, _ in program.inputs}
    made = {}  # key -> (aval, step index)
    live = set()
    ipu_live = tile_live = 0
    for i, st in enumerate(steps):
        dies_here = dying.get(i, ())
        for k, aval, into in zip(st.outputs, st.out_avals,
                                 _in_place(st, set(dies_here), constants)):
            made[k] = (aval, i)
            if into is not None and into in resident:
                resident.add(k)  # written into always-live memory
            elif into is not None and into in live:
                live.discard(into)  # its bytes pass to k
                live.add(k)
            else:
                live.add(k)
                ipu_live += _nbytes(aval)
                tile_live += tile_bytes(aval, tiles)
        yield i, st, live, ipu_live, tile_live, made
        for k in dies_here:
            if k in live:
                live.discard(k)
                aval = made[k][0]
                ipu_live -= _nbytes(aval)
                tile_live -= tile_bytes(aval, tiles)


def liveness_by_step(program, tiles):
    """live_steps with the peak inside each control-flow step's sub-graphs
    added (a loop body's temporaries exist while the step runs): yields
    (step index, step, keys live, IPU bytes, tile-0 bytes, made, inner
    _Peak or None). The bytes are what the profile draws per step and what
    the peak is the maximum of: one walk for the report and the check."""
    for i, st, live, ipu_live, tile_live, made in live_steps(program, tiles):
        inner = _inner_peak(st, tiles) if st.primitive.name in _CONTROL_FLOW else None
        yield (i, st, live, ipu_live + (inner.ipu_bytes if inner else 0),
               tile_live + (inner.tile_bytes if inner else 0), made, inner)


def peak_liveness(obj, tiles):
    """The not-always-live peak of a Graph, Executable or Program on an IPU
    of `tiles` tiles: the one analyze_memory reports (its step, its bytes
    on the IPU and on tile 0, the tensors live there, bodies included)."""
    return _liveness(program_of(obj), tiles)


def _liveness(program, tiles):
    """The not-always-live peak of a program's schedule: values made by its
    steps, from their step to their last use (outputs live to the end),
    plus, at a control-flow step, the peak inside its sub-graphs."""
    steps = program.steps
    made = {}
    peak_ipu = peak_tile = 0
    peak_at, peak_set, peak_inner = -1, set(), None
    for i, st, live, ipu_bytes, tile_bytes_, made, inner in liveness_by_step(program, tiles):
        peak_ipu = max(peak_ipu, ipu_bytes)
        if tile_bytes_ > peak_tile:
            peak_tile, peak_at = tile_bytes_, i
            peak_set, peak_inner = set(live), inner

    tensors = tuple(
        LiveTensor(_nbytes(made[k][0]), made[k][0],
                   _made_by(steps[made[k][1]], made[k][1]))
        for k in peak_set
    )
    name = "program start"
    if peak_at >= 0:
        st = steps[peak_at]
        name = st.primitive.name + (f" in {st.source}" if st.source else "")
        if peak_inner is not None and peak_inner.step >= 0:
            name += f", at its step {peak_inner.step}: {peak_inner.name}"
            tensors += peak_inner.tensors
    return _Peak(peak_ipu, peak_tile, peak_at, name, tensors)


def _in_place(step, dies_here, constants):
    """For each output of `step`, the operand whose memory it takes over, or
    None. Poplar updates in place where it can: a loop's carried state stays
    in its tensors (carry k of the result in carry k of the operands), and
    elementwise operations have in-place variants (mapInPlace, addInPlace
    and the like in poplibs' popops/ElementWise.hpp), used when an operand
    of the result's shape and type is not needed afterwards. Constants are never overwritten."""
    name = step.primitive.name
    if name in _LOOPS:
        n_carry = _carry_count(step)
        candidates = [[j] if j < n_carry else [] for j in range(len(step.outputs))]
    elif name in _IDENTITIES:
        candidates = [[j] for j in range(len(step.outputs))]
    elif name == "fused_elementwise" or _is_elementwise(step.primitive):
        candidates = [range(len(step.inputs))] * len(step.outputs)
    else:
        return [None] * len(step.outputs)
    taken = set()
    result = []
    for positions, aval in zip(candidates, step.out_avals):
        choice = next(
            (
                step.inputs[k] for k in positions
                if step.inputs[k] in dies_here
                and step.inputs[k] not in taken
                and step.inputs[k] not in constants
                and step.in_avals[k] == aval
            ),
            None,
        )
        if choice is not None:
            taken.add(choice)
        result.append(choice)
    return result


_LOOPS = frozenset({"scan", "while_loop"})
# Identities that mark a value for the compiler (recompute.py): the result
# is the operand's tensor.
_IDENTITIES = frozenset({"optimization_barrier", "recomputation_checkpoint"})


def _carry_count(step):
    if step.primitive.name == "scan":
        return step.params["n_carry"]
    cond = step.params["cond_graph"]
    return len(cond.inputs) - step.params["n_cond_consts"]


def _is_elementwise(primitive):
    from keras_ipu.device.compiler.lowering import is_elementwise  # no cycle at import

    return is_elementwise(primitive)


# Primitives whose params hold the graphs they run.
_CONTROL_FLOW = frozenset({"cond", "while_loop", "scan", "remat", "custom_vjp"})


def check_memory(obj, target=None, ipu=0):
    """analyze_memory, raising IPUOutOfMemoryError when a tile overflows."""
    report = analyze_memory(obj, target, ipu)
    if not report.fits:
        raise IPUOutOfMemoryError(report)
    return report


def resolve_target(target):
    """`target` as an IPUTarget: the configured system's when None, the
    target of that name when a string."""
    if target is None:
        return system_config.configuration().target
    if isinstance(target, str):
        return _targets.get_target(target)
    return target
