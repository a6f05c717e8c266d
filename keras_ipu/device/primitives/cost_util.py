"""Cost rules of the primitives, by category.

A cost rule is `rule(in_avals, out_avals, **params) -> Cost`: what one
application of the primitive does (FLOPs, MACs, bytes read and written)
and its kind, which selects the formulas of the cost model
(keras_ipu/device/simulator/cost_model.py, where every constant lives).
Control-flow rules carry the costs of their sub-graphs in `parts`.
"""

import collections
import math


from keras_ipu.device.simulator import cost_model

# kind: "elementwise", "view" (no data moves: reshape, bitcast), "copy"
# (data rearranged: transpose, slice, gather...; bytes_out is what it
# writes, which for an in-place update is the update only), "matmul", "reduce",
# "sort", "linalg", "fft", "random", "host" (dynamic shapes: never on the
# device), "link" (a copy between IPUs), "loop"/"call"/"cond" (control flow;
# see parts), "collective" (an all-reduce across replicas: link_bytes each
# IPU sends over its IPU-Links in link_steps synchronised steps).
# dtype: the compute dtype (selects fp16 vs fp32 rates).
# parts: (Part, ...) the sub-programs a control-flow step runs; combine
# "sum" runs all of them, "max" one of them (a cond: the costliest branch is
# counted). simulator/prediction.py composes their cycles.
Cost = collections.namedtuple(
    "Cost",
    "flops macs bytes_in bytes_out kind dtype parts combine link_bytes link_steps",
    defaults=(None, (), "sum", 0, 0),
)
# A sub-graph run `repeat` times (a scan body `length` times, a while loop's
# body its trip count: simulator/loop_trips.py), with the costs of its nodes.
Part = collections.namedtuple("Part", "repeat graph costs")


def size(aval):
    s = aval.size
    return 0 if s is None else s


def nbytes(aval):
    n = aval.nbytes
    return 0 if n is None else n


def _compute_dtype(ins, outs):
    for a in tuple(ins) + tuple(outs):
        if a.dtype.kind in "fcV":
            return a.dtype.name
    for a in tuple(outs) + tuple(ins):
        return a.dtype.name
    return None


def make(ins, outs, kind, flops=0, macs=0, **extra):
    return Cost(
        int(flops), int(macs),
        sum(nbytes(a) for a in ins), sum(nbytes(a) for a in outs),
        kind, _compute_dtype(ins, outs), **extra,
    )


def elementwise(flops_per_element=1):
    """One (or `flops_per_element`) vector op per output element."""

    def rule(ins, outs, **params):
        return make(ins, outs, "elementwise", flops_per_element * sum(map(size, outs)))

    return rule


transcendental = elementwise(cost_model.TRANSCENDENTAL_FLOPS)


def view(ins, outs, **params):
    """No data moves (a reshape or bitcast re-labels the same bytes)."""
    return make(ins, outs, "view")


def copy(ins, outs, **params):
    """Data rearranged: every output byte is written once, over the exchange."""
    return make(ins, outs, "copy")


def update(operand):
    """An in-place update (dynamic_update_slice, scatter): it writes only
    the bytes of its `operand`-th input (the update), over the exchange."""

    def rule(ins, outs, **params):
        written = nbytes(ins[operand]) if len(ins) > operand else 0
        return make(ins, outs, "copy", sum(map(size, ins[operand:operand + 1])))._replace(
            bytes_out=written
        )

    return rule


def link(ins, outs, **params):
    """A copy between IPUs over the IPU-Links (kind "link"): its bytes cross
    once, after a global sync."""
    return make(ins, outs, "link")


def reduction(flops_per_element=1):
    """One op per input element of the reduced operand(s)."""

    def rule(ins, outs, **params):
        return make(ins, outs, "reduce", flops_per_element * sum(map(size, ins)))

    return rule


def host(ins, outs, **params):
    """Dynamic-shape ops run on the host only; counted as one pass."""
    return make(ins, outs, "host", sum(map(size, ins)))


def per_output(kind, flops_per_output):
    """`flops_per_output(ins, outs, **params)` FLOPs, of the given kind."""

    def rule(ins, outs, **params):
        return make(ins, outs, kind, flops_per_output(ins, outs, **params))

    return rule


def log2(n):
    return math.log2(n) if n > 1 else 1.0


# -- sub-graphs -----------------------------------------------------------------


def node_cost(node):
    rule = node.primitive.cost
    if rule is None:
        raise LookupError(
            f"Primitive {node.primitive.name!r} has no cost rule: assign "
            f"`{node.primitive.name}_p.cost` in its primitive module "
            "(see keras_ipu/device/primitives/cost_util.py)."
        )
    ins = tuple(v.aval for v in node.inputs)
    outs = tuple(v.aval for v in node.outputs)
    if node.primitive.cost_reads_operands:
        return rule(ins, outs, operands=tuple(node.inputs), **node.params)
    return rule(ins, outs, **node.params)


def part(repeat, graph):
    """The Part of `graph` run `repeat` times."""
    return Part(repeat, graph, tuple(node_cost(node) for node in graph.nodes))


def totals(costs):
    """(flops, macs) of a list of costs, parts included (cond: largest)."""
    flops = macs = 0
    for c in costs:
        flops += c.flops
        macs += c.macs
        sub = [(p.repeat * f, p.repeat * m) for p in c.parts for f, m in [totals(p.costs)]]
        if sub:
            if c.combine == "max":
                f, m = max(sub, key=lambda fm: fm[0] + 2 * fm[1])
            else:
                f, m = sum(s[0] for s in sub), sum(s[1] for s in sub)
            flops += f
            macs += m
    return flops, macs


def control(ins, outs, kind, parts, combine="sum"):
    """The cost of a control-flow step running `parts` (Part, ...)."""
    return make(ins, outs, kind, parts=tuple(parts), combine=combine)
