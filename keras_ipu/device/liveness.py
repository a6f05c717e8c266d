"""Liveness: when each value of a program is read, read last and freed, and
what is live at each step. The one analysis of it, for

- the executable: which slots to clear after each step (`dying`), so NumPy
  can reuse their memory;
- donation and fusion: each value's readers and last reader;
- the memory model and the profile: bytes live at each step (`walk`), a
  control-flow step's sub-graphs' peak inside it.

Graph inputs are read from the start; graph outputs live to the end (step
len(nodes)); a value never read dies where it is made (an input never read:
at step -1). Literals are constants, resident for the whole program, and
counted apart.
"""

import dataclasses

from keras_ipu.device.ir import Literal
from keras_ipu.device.ir import subgraphs


@dataclasses.dataclass
class Liveness:
    # Var -> index of the node that makes it (graph inputs: absent).
    made_at: dict
    # Var -> index of the last node reading it; len(nodes) for graph
    # outputs; the defining node's index (-1 for an input) when never read.
    last_use: dict
    # Var -> indices of the nodes reading it, in order (a node reading it
    # twice is listed once).
    readers: dict
    # Var -> how many operands read it (a node reading it twice: 2).
    reads: dict
    # Var -> how many of the graph's outputs are it.
    returned: dict
    # step index -> the Vars whose last use it is (-1: inputs never read).
    dying: dict
    # bytes of the distinct constants (Literals) the program holds.
    constant_bytes: int
    end: int  # len(nodes): the "step" of the program's outputs

    def dying_after(self, index):
        return self.dying.get(index, [])

    def read_once(self, var):
        """Whether exactly one operand of one node reads `var` and it is no
        program output (a pass may then rewrite that reader and the maker
        together)."""
        return self.reads.get(var) == 1 and self.last_use[var] != self.end

    def uses(self, var):
        """How many operands of the nodes and outputs of the graph are `var`."""
        return self.reads.get(var, 0) + self.returned.get(var, 0)


def analyze(graph):
    """The Liveness of `graph` (its own nodes; sub-graphs are not opened)."""
    end = len(graph.nodes)
    made_at = {}
    last_use = {v: -1 for v in graph.inputs}
    readers = {}
    reads = {}
    returned = {}
    constants = {}
    for i, node in enumerate(graph.nodes):
        for v in node.inputs:
            if type(v) is Literal:
                constants[id(v.value)] = v.aval.nbytes or 0
                continue
            last_use[v] = i
            reads[v] = reads.get(v, 0) + 1
            seen = readers.setdefault(v, [])
            if not seen or seen[-1] != i:
                seen.append(i)
        for v in node.outputs:
            made_at[v] = i
            last_use.setdefault(v, i)
    for v in graph.outputs:
        if type(v) is Literal:
            constants[id(v.value)] = v.aval.nbytes or 0
        else:
            last_use[v] = end
            returned[v] = returned.get(v, 0) + 1
    dying = {}
    for v, last in last_use.items():
        dying.setdefault(last, []).append(v)
    return Liveness(made_at, last_use, readers, reads, returned, dying,
                    sum(constants.values()), end)


@dataclasses.dataclass
class LiveStep:
    """What is live while step `index` (`node`) runs: its results and the
    values it reads last included."""

    index: int
    node: object
    live: set  # the walker's own set: copy it to keep it
    totals: list  # sum of weigh(v) over `live`, per component
    made: dict  # Var -> index of the step that made it, so far
    # A control-flow step: the LivePeak of its costliest sub-graph (by the
    # last component), which runs on top of `live`; else None.
    inner: object = None

    def with_inner(self):
        """totals plus the inner peak's maxima."""
        if self.inner is None:
            return list(self.totals)
        if not self.totals:  # nothing weighed yet outside
            return list(self.inner.maxima)
        return [a + b for a, b in zip(self.totals, self.inner.maxima)]


@dataclasses.dataclass
class LivePeak:
    """The peak of a walk: `step`, a kept copy of the LiveStep where the last
    component (inner peaks included) is largest; `maxima`, each component's
    largest value over the steps (inner peaks included)."""

    step: LiveStep
    maxima: list


def walk(graph, weigh, *, inputs_live=False, in_place=None, liveness=None, streamed=None):
    """Yields a LiveStep per step of `graph`.

    weigh(var) -> tuple of numbers (bytes on the IPU, on a tile...): what a
    live value costs. inputs_live: graph inputs are live from the start
    until their last use (the host's buffers); otherwise they are not
    counted (the IPU's always-live memory). in_place(node, dying) -> for each
    output, the operand (a Var dying at this step) whose memory it takes
    over, or None: such a result adds nothing, and one written into memory
    not counted here (an input) is not counted either. streamed: (inputs,
    outputs) held in streaming memory (offloaded variables): such an input
    is live from its first reader (loaded there) to its last, such an
    output from its step to its last reader in the program (stored back
    then), not to the end. One handed to a loop or branch goes on streamed
    inside it (streamed_into): loaded where its body reads it, its new
    value stored back where the body returns it (a device loop's weight
    update loads and stores each variable's state in turn), so the
    control-flow step itself holds none of it.
    """
    liveness = liveness or analyze(graph)
    dying = liveness.dying
    loads = set()
    if streamed is not None:
        loads, stores = set(streamed[0]), set(streamed[1])
        dying = {step: list(vs) for step, vs in dying.items()}
        for v in stores & set(dying.get(liveness.end, ())):
            dying[liveness.end].remove(v)
            seen = liveness.readers.get(v)
            dying.setdefault(seen[-1] if seen else liveness.made_at.get(v, -1), []).append(v)
    live = set()
    uncounted = set()  # values held in memory not counted here (inputs)
    made = {}
    totals = []
    # What each live value was weighed at: a result computed in place keeps
    # its operand's (the same bytes, in the same place).
    weights = {}

    def add(sign, var):
        w = weigh(var) if sign > 0 else weights.pop(var)
        if sign > 0:
            weights[var] = w
        if not totals:
            totals.extend(0 for _ in w)
        for k, x in enumerate(w):
            totals[k] += sign * x

    if inputs_live:
        for v in graph.inputs:
            live.add(v)
            add(1, v)
        for v in dying.get(-1, ()):
            live.discard(v)
            add(-1, v)
    else:
        uncounted.update(v for v in graph.inputs if v not in loads)
    for i, node in enumerate(graph.nodes):
        handed, inside = streamed_into(node, loads) if loads else ((), {})
        # Handed to a body: in Streaming Memory here, as is a carry made of it.
        uncounted.update(handed)
        for v in node.inputs:
            if v in loads and v not in live and v not in handed:
                live.add(v)
                add(1, v)
        dies_here = dying.get(i, ())
        into = in_place(node, set(dies_here)) if in_place is not None else None
        for k, v in enumerate(node.outputs):
            made[v] = i
            source = into[k] if into is not None else None
            if source is not None and source in uncounted:
                uncounted.add(v)  # written into memory counted elsewhere
            elif source is not None and source in live:
                live.discard(source)  # its bytes pass to v
                live.add(v)
                weights[v] = weights.pop(source)
            else:
                live.add(v)
                add(1, v)
        inner = None
        for sub in subgraphs(node):
            top = peak(sub, weigh, in_place=in_place, streamed=inside.get(id(sub)))
            if top is not None and (inner is None or top.maxima[-1] > inner.maxima[-1]):
                inner = top
        yield LiveStep(i, node, live, totals, made, inner)
        for v in dies_here:
            if v in live:
                live.discard(v)
                add(-1, v)


def streamed_into(node, loads):
    """(the operands of `node` in `loads` it hands to its sub-graphs, {id of
    a sub-graph: its (loads, stores)}): a sub-graph input receiving a
    loaded operand is loaded inside, and a loop body's carry k returned for
    a loaded carry operand k is stored back."""
    prim = node.primitive
    if not prim.subgraph_params or prim.subgraph_operands is None:
        return (), {}
    feeds = prim.subgraph_operands(node.params)
    n_carry = prim.carry_count(node.params) if prim.carry_count else 0
    handed, inside = set(), {}
    for sub, positions in zip(subgraphs(node), feeds):
        if positions is None:
            continue
        sub_loads = {x for x, p in zip(sub.inputs, positions) if node.inputs[p] in loads}
        if not sub_loads:
            continue
        handed.update(node.inputs[p] for p in positions if node.inputs[p] in loads)
        stores = {sub.outputs[k] for k in range(min(n_carry, len(sub.outputs)))
                  if k < len(positions) and positions[k] == k and node.inputs[k] in loads}
        inside[id(sub)] = (sub_loads, stores)
    return handed, inside


def peak(graph, weigh, *, inputs_live=False, in_place=None, liveness=None, streamed=None):
    """The LivePeak of a walk of `graph` (see walk); None when nothing is
    ever live (no steps, or nothing weighed)."""
    best, maxima = None, None
    for step in walk(graph, weigh, inputs_live=inputs_live, in_place=in_place,
                     liveness=liveness, streamed=streamed):
        totals = step.with_inner()
        if not totals:
            continue
        if maxima is None:
            maxima = list(totals)
        else:
            maxima = [max(a, b) for a, b in zip(maxima, totals)]
        if best is None or totals[-1] > best.totals[-1]:
            best = LiveStep(step.index, step.node, set(step.live), totals,
                            dict(step.made), step.inner)
    return None if best is None else LivePeak(best, maxima)
