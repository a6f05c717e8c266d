"""The IPU memory model of a program: always-live and not-always-live
bytes, per IPU and per tile, and the out-of-memory error. A placed program
(compiler/placement.py) is counted IPU by IPU from its nodes' tags.

Every tensor is mapped linearly over the tiles with Poplar's default grain
(cost_model.linear_mapping: 8-byte grains, at least 128 bytes per tile
[POPUTIL]), starting where the previous one ended as Graphcore's
TensorFlow backend places them [TFMAP]; the code of each step sits on the
tiles it touches (simulator/tile_mapping.py). The report names the fullest
tile at the peak and its bytes.

Always live: the program's inputs (weights, optimizer state and the stream
buffers of the data fed in: of a feed, one element, feeds.py), its
constants, and the code estimate.
Not always live: the values made by the program's steps, from their step
to their last use (graph outputs to the end); the peak over the schedule.
The program is read as Poplar holds its values (materialized.as_held: a
fused chain's square read only by sums, or conversion read by one
elementwise step, is not held).
With schedule="best" (the training predictions) the peak is the lower of
the program's own order and a post-order walk from its outputs, as
Poplar's default IPUConfig.scheduling.algorithm, CHOOSE_BEST, makes
several schedules (among them POST_ORDER) and keeps the one with the
lowest liveness; the executable's own check keeps the program order.
Inputs held in Streaming Memory (offloaded optimizer state, `streamed`)
are not always live: each is on the IPU from the step that loads it to its
last use, its new value until it is stored back (cost_model [TFOFFLOAD]).
"""

import dataclasses

import numpy as np

from keras_ipu.device import liveness
from keras_ipu.device.config import system_config
from keras_ipu.device.ir import Graph
from keras_ipu.device.ir import Literal
from keras_ipu.device.ir import ipus_of
from keras_ipu.device.ir import output_tag
from keras_ipu.device.ir import runs_on
from keras_ipu.device.ir import subgraphs
from keras_ipu.device.primitives.inter_ipu import ipu_copy_p
from keras_ipu.device.simulator import cost_model
from keras_ipu.device.simulator import feeds as _feeds
from keras_ipu.device.simulator.materialized import as_held
from keras_ipu.device.simulator import memory_remedies
from keras_ipu.device.simulator import targets as _targets
from keras_ipu.device.simulator import tile_mapping
from keras_ipu.device.units import fmt_bytes as _fmt_bytes


def graph_of(obj):
    """The program of a Graph or of a compiled Executable: a Graph whose
    nodes are its steps, in order; an Executable's as it runs (its loop
    bodies and branches the compiled ones: Executable.running_graph)."""
    if isinstance(obj, Graph):
        return obj
    for name in ("running_graph", "graph"):
        graph = getattr(obj, name, None)
        if isinstance(graph, Graph):
            return graph
    raise TypeError(
        f"Cannot cost {type(obj).__name__}: pass a keras_ipu Graph or an "
        "Executable (keras_ipu.device.compiler.compile_graph(graph))."
    )


def constants_of(graph, read=None):
    """The avals of the distinct constants (Literals) `graph` holds (those in
    `read` only, when given)."""
    seen = {}
    for v in [v for node in graph.nodes for v in node.inputs] + list(graph.outputs):
        if type(v) is Literal and (read is None or v in read):
            seen.setdefault(id(v.value), v.aval)
    return list(seen.values())


# -- placed programs: what each IPU holds ---------------------------------------
def tagged_nodes(graph):
    """The nodes of `graph` (sub-graphs included) the placement tagged."""
    for node in graph.nodes:
        if node.ipu is not None:
            yield node
        for sub in subgraphs(node):
            yield from tagged_nodes(sub)


def steps_on(node):
    """The IPUs where `node` is a program step: the one it runs on; both
    ends of a copy; every IPU a control-flow node's sub-graphs span."""
    where = runs_on(node)
    if node.primitive is ipu_copy_p:
        return {where, node.params["src"]}
    if where is None:
        return {i for sub in subgraphs(node) for i in ipus_of(sub)}
    return {where}


def reads_on(graph, ipu):
    """The values (Vars and Literals) read by the steps on `ipu`; a
    sub-graph's input read there counts as a read of the operand feeding it."""
    found = set()
    for node in graph.nodes:
        where = runs_on(node)
        if where is not None:
            if ipu in steps_on(node):
                found.update(node.inputs)
            continue
        feeds = node.primitive.subgraph_operands(node.params)
        for sub, positions in zip(subgraphs(node), feeds):
            if positions is None:
                continue
            inner = reads_on(sub, ipu)
            found.update(node.inputs[p] for v, p in zip(sub.inputs, positions) if v in inner)
    return found


def homes(graph, found=None):
    """{Var: the IPU holding it} for the values the nodes of `graph` (and of
    its sub-graphs) make, and for its inputs and its sub-graphs' the IPU
    where their first reader runs (a variable kept in Streaming Memory is
    loaded onto that IPU); a value not placed is on IPU 0."""
    found = {} if found is None else found
    for node in graph.nodes:
        for k, v in enumerate(node.outputs):
            held = output_tag(node, k, "ipu")
            found[v] = 0 if held is None else held
        for sub in subgraphs(node):
            homes(sub, found)
    _input_homes(graph, found)
    return found


def _input_homes(graph, found):
    """Adds to `found` the home of each input of `graph`: the IPU of its
    first placed reader, or the home of the sub-graph input it feeds."""
    inputs = set(graph.inputs)
    for node in graph.nodes:
        where = runs_on(node)
        if where is not None:
            found.update((v, where) for v in node.inputs if v in inputs and v not in found)
            continue
        feeds = node.primitive.subgraph_operands(node.params)
        for sub, positions in zip(subgraphs(node), feeds):
            for x, p in zip(sub.inputs, positions or ()):
                v = node.inputs[p]
                if v in inputs and v not in found and x in found:
                    found[v] = found[x]


@dataclasses.dataclass(frozen=True)
class Held:
    """What IPU `ipu` holds of a program besides the values its steps make
    and their code (layout_on): the program inputs (Vars) and constants
    (avals) its steps read. Everything, on a one-IPU program."""

    ipu: int
    inputs: tuple
    constants: tuple


def held_on(graph, ipu=0):
    """The Held of `graph` on IPU `ipu`."""
    if any(True for _ in tagged_nodes(graph)):
        read = reads_on(graph, ipu)
        return Held(ipu, tuple(v for v in graph.inputs if v in read),
                    tuple(constants_of(graph, read)))
    return Held(ipu, tuple(graph.inputs), tuple(constants_of(graph)))


def _nbytes(aval):
    return aval.nbytes or 0


def tile_bytes(aval, tiles):
    """Bytes of `aval` on its fullest tile under linear mapping."""
    return cost_model.linear_mapping(_nbytes(aval), aval.dtype.itemsize, tiles)[1]


def layout_on(graph, tiles, ipu=0, held=None, feeds=None):
    """The tile_mapping.Layout of `graph` on IPU `ipu`: the inputs and
    constants it holds, the values its steps make there, its steps' code;
    of the values its Feeds stream (feeds.py), one element each."""
    graph = as_held(graph)
    held = held or held_on(graph, ipu)
    fed = _feeds.held_avals(graph, feeds)
    if any(True for _ in tagged_nodes(graph)):
        home = homes(graph)
        return tile_mapping.layout(graph, tiles, held.inputs, held.constants,
                                   lambda node: ipu in steps_on(node),
                                   lambda v: home.get(v, 0) == ipu,
                                   _placed_in_place(home), held=fed)
    return tile_mapping.layout(graph, tiles, held.inputs, held.constants,
                               lambda node: True, lambda v: True, in_place, held=fed)


def always_live_tiles(layout, held, remote=()):
    """Always-live bytes per tile: code, and the inputs (those not in
    Streaming Memory) and constants held."""
    out = layout.code.copy()
    for v in held.inputs:
        if v not in remote:
            out += layout.vector(v, v.aval)
    for k, aval in enumerate(held.constants):
        out += layout.vector(("constant", k), aval)
    return out


@dataclasses.dataclass
class LiveTensor:
    nbytes: int
    aval: object
    made_by: str  # Keras layer path, else the primitive (and step)
    start: int = 0  # its first tile (tile_mapping)

    def describe(self):
        return f"{self.aval.short():<20} {_fmt_bytes(self.nbytes):>11}  {self.made_by}"


@dataclasses.dataclass
class MemoryReport:
    target: object
    ipu: int
    tiles: int
    always_live_bytes: int  # per IPU
    input_bytes: int  # on the IPU (streamed inputs not included)
    constant_bytes: int
    code_bytes: int  # per IPU
    not_always_live_bytes: int  # peak, per IPU
    peak_step: int  # index of the step at the peak (-1: before the first)
    peak_step_name: str
    tile: int  # the fullest tile at the peak
    tile_bytes: int  # its peak bytes (always + not-always live)
    tile_always_live_bytes: int  # the always-live bytes of that tile
    largest_live: list  # LiveTensor, largest first, at the tile peak
    streamed_bytes: int = 0  # inputs of this IPU held in Streaming Memory

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
            f"{_fmt_bytes(t.sram_bytes_per_tile * self.tiles)}"
            + (f"  (+ {_fmt_bytes(self.streamed_bytes)} in Streaming Memory)"
               if self.streamed_bytes else ""),
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


def made_by(node, index):
    if node.primitive is ipu_copy_p:
        what = f"copy from IPU {node.params['src']}"
        return f"{what} for {node.source} (step {index})" if node.source else (
            f"{what} (step {index})")
    if node.source:
        return f"{node.source} ({node.primitive.name}, step {index})"
    return f"{node.primitive.name} (step {index})"


def analyze_memory(obj, target=None, ipu=0, top=5, streamed=None, schedule="program",
                   feeds=None):
    """The MemoryReport of a Graph or Executable on IPU `ipu` of `target`
    (an IPUTarget or its name; default: the current system's). A placed
    program (compiler/placement.py) counts on each IPU what its nodes hold
    there: the inputs and constants they read, the code of the steps that
    run there (a copy runs on both IPUs), the values they make. streamed:
    (inputs, outputs) of the program held in Streaming Memory (see the
    module doc). schedule: "program" or "best" (module doc). feeds: the
    feeds.Feeds of the program (its infeed's inputs and outfeed's outputs:
    one element of each held), or None."""
    target = resolve_target(target)
    graph = as_held(graph_of(obj))
    tiles = target.tiles_per_ipu
    held = held_on(graph, ipu)
    remote = set(streamed[0]) if streamed is not None else set()
    streamed_bytes = sum(_nbytes(v.aval) for v in held.inputs if v in remote)
    inputs = [v for v in held.inputs if v not in remote]
    constants = list(held.constants)
    layout = layout_on(graph, tiles, ipu, held, feeds)
    input_bytes = sum(_nbytes(layout.aval(v, v.aval)) for v in inputs)
    constant_bytes = sum(_nbytes(a) for a in constants)
    base = always_live_tiles(layout, held, remote)

    peak = not_always_live(graph, tiles, ipu, streamed, layout, base)
    if schedule == "best":
        # The same tensors and tiles, another order of the steps.
        other = not_always_live(post_order(graph), tiles, ipu, streamed, layout, base)
        if other.tile_bytes < peak.tile_bytes:
            peak = other
    candidates = (
        list(peak.tensors)
        + [LiveTensor(_nbytes(layout.aval(v, v.aval)), layout.aval(v, v.aval),
                      "program input", layout.start(v)) for v in inputs]
        # Values a traced function closed over (weights under jit) are
        # constants of the program.
        + [LiveTensor(_nbytes(a), a, "program constant", layout.start(("constant", k)))
           for k, a in enumerate(constants)]
    )
    candidates.sort(key=lambda x: -x.nbytes)
    total = base if peak.load is None else base + peak.load
    fullest = int(total.argmax())
    return MemoryReport(
        target=target, ipu=ipu, tiles=tiles,
        always_live_bytes=input_bytes + constant_bytes + int(layout.code.sum()),
        input_bytes=input_bytes, constant_bytes=constant_bytes,
        code_bytes=int(layout.code.sum()),
        not_always_live_bytes=peak.ipu_bytes, peak_step=peak.step,
        peak_step_name=peak.name, tile=fullest, tile_bytes=int(total[fullest]),
        tile_always_live_bytes=int(base[fullest]), largest_live=candidates[:top],
        streamed_bytes=streamed_bytes,
    )


def post_order(graph):
    """`graph` with its steps in the order of a post-order walk from its
    outputs (each output's operands first, in operand order; steps no
    output needs after, from their own), as the POST_ORDER scheduler of
    Graphcore's TensorFlow orders a program: a shallow copy (same nodes,
    same values)."""
    maker = {v: node for node in graph.nodes for v in node.outputs}
    done, order = set(), []

    def visit(root):
        stack = [(root, iter(root.inputs))]
        done.add(id(root))
        while stack:
            node, operands = stack[-1]
            for v in operands:
                up = maker.get(v)
                if up is not None and id(up) not in done:
                    done.add(id(up))
                    stack.append((up, iter(up.inputs)))
                    break
            else:
                stack.pop()
                order.append(node)

    for v in graph.outputs:
        node = maker.get(v)
        if node is not None and id(node) not in done:
            visit(node)
    for node in graph.nodes:
        if id(node) not in done:
            visit(node)
    out = Graph()
    out.inputs, out.nodes, out.outputs = list(graph.inputs), order, list(graph.outputs)
    return out


@dataclasses.dataclass
class Peak:
    ipu_bytes: int  # largest not-always-live bytes on the IPU over the steps
    tile_bytes: int  # how far they raise the fullest tile above the always-live one's
    step: int  # outer step index of the tile peak (-1: none)
    name: str  # the step's primitive and layer (and the inner step's)
    tensors: tuple  # LiveTensor of the values live at the tile peak
    load: object = None  # their bytes per tile (int64 array), None: nothing


def weigher(layout, base, home=None, ipu=0):
    """weigh(var) for liveness.walk: (bytes on the IPU, a TileLoad of its
    bytes per tile on top of `base`); with `home` ({Var: IPU}), values held
    on another IPU than `ipu` weigh nothing."""
    zero = tile_mapping.TileLoad(np.zeros(layout.tiles, np.int64), base)
    cache = {}

    def weigh(var):
        if home is not None and home.get(var, 0) != ipu:
            return 0, zero
        w = cache.get(var)
        if w is None:
            aval = layout.aval(var, var.aval)
            w = cache[var] = (_nbytes(aval),
                              tile_mapping.TileLoad(layout.vector(var, aval), base))
        return w

    return weigh


def _described(step, graph, layout, keep=None):
    """(LiveTensors, name) of a LiveStep of `graph`, its inner peak's
    values included (those `keep(var)` accepts, when given)."""
    nodes = graph.nodes
    tensors = tuple(
        LiveTensor(_nbytes(layout.aval(v, v.aval)), layout.aval(v, v.aval),
                   made_by(nodes[step.made[v]], step.made[v]) if v in step.made
                   else "loaded from Streaming Memory", layout.start(v))
        for v in step.live if keep is None or keep(v)
    )
    node = step.node
    name = node.primitive.name + (f" in {node.source}" if node.source else "")
    inner = step.inner
    if inner is not None and inner.maxima[0] > 0:
        sub = next(g for g in subgraphs(node) if inner.step.node in g.nodes)
        inner_tensors, inner_name = _described(inner.step, sub, layout, keep)
        name += f", at its step {inner.step.index}: {inner_name}"
        tensors += inner_tensors
    return tensors, name


def _tiles_of(graph, tiles, ipu, streamed, layout, base, feeds=None):
    """(layout, base) of `graph` on IPU `ipu`, made when not given."""
    if layout is None:
        held = held_on(graph, ipu)
        layout = layout_on(graph, tiles, ipu, held, feeds)
        remote = set(streamed[0]) if streamed is not None else set()
        base = always_live_tiles(layout, held, remote)
    return layout, base


def _on_ipu(graph, layout, base, ipu):
    """(weigh, in_place, keep) of the liveness walk of `graph` on IPU
    `ipu`: on a placed program values held elsewhere weigh nothing, a
    result takes over its operand's memory only on the operand's IPU, and
    `keep(var)` says whether a live value is held there (None: all are)."""
    if not any(True for _ in tagged_nodes(graph)):
        return weigher(layout, base), in_place, None
    home = homes(graph)
    return (weigher(layout, base, home, ipu), _placed_in_place(home),
            lambda v: home.get(v, 0) == ipu)


def _placed_in_place(home):
    """in_place on a placed program: a result takes over an operand's
    memory only on the operand's IPU."""

    def in_place_here(node, dies_here):
        into = in_place(node, dies_here)
        if into is None:
            return None
        return [src if src is not None and home.get(src, 0) == home.get(out, 0)
                else None for src, out in zip(into, node.outputs)]

    return in_place_here


def not_always_live(graph, tiles, ipu=0, streamed=None, layout=None, base=None,
                    feeds=None):
    """The not-always-live Peak of a program on IPU `ipu`: values made by
    its steps, from their step to their last use (outputs live to the end),
    plus, at a control-flow step, the peak inside its sub-graphs (a loop
    body's temporaries exist once: each iteration frees them); results
    computed in place (in_place) take no memory of their own. The peak is
    the step where the fullest tile (always-live bytes `base` included) is
    fullest; layout and base: the program's (layout_on, always_live_tiles),
    made when not given (with `feeds`)."""
    graph = as_held(graph)
    layout, base = _tiles_of(graph, tiles, ipu, streamed, layout, base, feeds)
    weigh, in_place_here, keep = _on_ipu(graph, layout, base, ipu)
    top = liveness.peak(graph, weigh, in_place=in_place_here, streamed=streamed)
    if top is None or top.maxima[0] <= 0:
        return Peak(0, 0, -1, "program start", ())
    tensors, name = _described(top.step, graph, layout, keep)
    load = top.step.totals[-1]
    return Peak(top.maxima[0], int(load), top.step.index, name, tensors, load.vector)


def liveness_by_step(obj, tiles, ipu=0, streamed=None, feeds=None):
    """The walk of not_always_live on IPU `ipu`, step by step: yields (step
    index, node, values live, IPU bytes, tile-0 bytes, {value: step that
    made it}, inner Peak or None), the bytes including the peak inside a
    control-flow step's sub-graphs (a loop body's temporaries exist while
    the step runs): what the profile draws per step and what the peak is
    the maximum of. On a placed program the values and bytes are those
    held on `ipu`. The live set may be the walker's own: copy it to keep
    it."""
    graph = as_held(graph_of(obj))
    layout, base = _tiles_of(graph, tiles, ipu, streamed, None, None, feeds)
    weigh, in_place_here, keep = _on_ipu(graph, layout, base, ipu)
    for step in liveness.walk(graph, weigh, in_place=in_place_here, streamed=streamed):
        ipu_bytes, tile_bytes_ = step.with_inner() or (0, 0)
        inner = None
        if step.inner is not None and step.inner.maxima[0] > 0:
            sub = next(g for g in subgraphs(step.node) if step.inner.step.node in g.nodes)
            tensors, name = _described(step.inner.step, sub, layout, keep)
            top = step.inner.maxima[-1]
            inner = Peak(step.inner.maxima[0], int(top), step.inner.step.index, name,
                         tensors, top.vector)
        live = step.live if keep is None else {v for v in step.live if keep(v)}
        yield step.index, step.node, live, ipu_bytes, int(tile_bytes_), step.made, inner


def peak_liveness(obj, tiles, ipu=0, streamed=None, feeds=None):
    """The not-always-live Peak of a Graph or Executable on IPU `ipu` (of
    `tiles` tiles): the one analyze_memory reports with the program order
    (its step, its bytes on the IPU and per tile, the tensors live there,
    bodies included)."""
    return not_always_live(graph_of(obj), tiles, ipu, streamed, feeds=feeds)


def in_place(node, dies_here):
    """For each output of `node`, the operand whose memory it takes over, or
    None. Poplar updates in place where it can: a loop's carried state stays
    in its tensors (carry k of the result in carry k of the operands), and
    elementwise operations have in-place variants (mapInPlace, addInPlace
    and the like in poplibs' popops/ElementWise.hpp), used when an operand
    of the result's shape and type is not needed afterwards (it dies here).
    Constants are never overwritten."""
    prim = node.primitive
    if prim.carry_count is not None:
        n_carry = prim.carry_count(node.params)
        candidates = [[j] if j < n_carry else [] for j in range(len(node.outputs))]
    elif prim.aliases_operands:
        candidates = [[j] for j in range(len(node.outputs))]
    elif prim.elementwise:
        candidates = [range(len(node.inputs))] * len(node.outputs)
    else:
        return None
    taken = set()
    result = []
    for positions, out in zip(candidates, node.outputs):
        choice = next(
            (
                node.inputs[k] for k in positions
                if node.inputs[k] in dies_here
                and node.inputs[k] not in taken
                and node.inputs[k].aval == out.aval
            ),
            None,
        )
        if choice is not None:
            taken.add(choice)
        result.append(choice)
    return result


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
