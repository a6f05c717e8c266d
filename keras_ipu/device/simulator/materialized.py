"""Which results of a fused elementwise chain Poplar holds in memory: the
memory model reads a program through `as_held(graph)`, a view of it (not
runnable) in which a fused node's result that Graphcore's TensorFlow
backend would never write to memory is not a result: its reader reads the
value Poplar keeps instead.

Our fusion pass (compiler/fusion.py) groups a chain by shape and program
order and returns every value an outside node reads. Graphcore's backend
builds its expressions differently, and two of its rules keep values out
of memory that our grouping returns:

- [TFSQ] A sum of squares is one reduction: fuse_ops_late.cc matches
  reduce-add(multiply(x, x)) (also x in float16 summed in float32) as
  the fusion "reduction_square_add", lowered to popops' reduce with
  Operation::SQUARE_ADD (ops/reduction_ops.cc), which reads x; XLA's
  algebraic simplifier rewrites pow(x, 2) as multiply(x, x) first
  (algebraic_simplifier.cc, HandlePower). So a square (square, pow by the
  constant 2, mul(x, x)) read only by sums is not held: the sums read x.
- [TFEXPR] A conversion read by one elementwise operation is part of that
  operation's expression: expression_outliner.cc outlines trees of
  elementwise operations (kConvert among them) whose every operand but the
  root has a single user into one popops map expression, which reads the
  tree's leaves. So a convert_element_type read once, by an elementwise
  node, is not held: its reader reads the converted value.

A value that takes the square's or the conversion's place and was a
temporary of the chain becomes a result of the fused node (it is held, as
Poplar holds a value with several users). Nothing else changes: the view
has the same nodes, in the same order, with the same placement, and its
graphs the same inputs and outputs.
"""

import weakref

import numpy as np

from keras_ipu.device.ir import Graph
from keras_ipu.device.ir import Literal
from keras_ipu.device.ir import Node
from keras_ipu.device.ir import Var

_FUSED = "fused_elementwise"


# The view of each graph read so far, while the graph lives (None: the
# graph itself): every reader of a program's memory (the report, its
# per-tile layout, the profile's pictures) must see the same Vars.
_VIEWS = weakref.WeakKeyDictionary()


def as_held(graph):
    """The view of `graph` (and of its sub-graphs) with the fused results
    Poplar does not hold taken out (module doc); `graph` itself when
    nothing changes. The same view for the same graph."""
    try:
        view = _VIEWS[graph]
    except KeyError:
        # Until nothing changes (a value taking a dropped one's place may
        # itself be one Poplar does not hold), so that the view of the view
        # (or of its steps reordered: memory_model.post_order) is itself.
        view, step = graph, _view(graph)
        while step is not None:
            view, step = step, _view(step)
        _VIEWS[view] = None
        view = _VIEWS[graph] = None if view is graph else view
    return graph if view is None else view


def _view(graph):
    """One pass of as_held's rules over `graph` (None: nothing changes)."""
    readers = {}
    for i, node in enumerate(graph.nodes):
        for v in node.inputs:
            if type(v) is not Literal:
                readers.setdefault(v, []).append(i)
    outputs = {v for v in graph.outputs if type(v) is not Literal}
    nodes = list(graph.nodes)
    replaced = {}  # Var no longer made -> the Var its readers read
    changed = False
    for i, node in enumerate(graph.nodes):
        if node.primitive.subgraph_params:
            params = _with_held_subgraphs(node)
            if params is not None:
                nodes[i] = _renode(node, node.inputs, params, node.outputs)
                changed = True
        elif node.primitive.name == _FUSED:
            held = _held_chain(node, nodes, readers, outputs, replaced)
            if held is not None:
                params, new_outputs, moved = held
                nodes[i] = _renode(node, node.inputs, params, new_outputs)
                replaced.update(moved)
                changed = True
    if not changed:
        return None
    if replaced:
        nodes = [n if not replaced.keys() & set(n.inputs) else
                 _renode(n, [replaced.get(v, v) if type(v) is not Literal else v
                             for v in n.inputs], n.params, n.outputs)
                 for n in nodes]
    out = Graph()
    out.inputs, out.nodes, out.outputs = list(graph.inputs), nodes, list(graph.outputs)
    return out


def _renode(node, inputs, params, outputs):
    return Node(node.primitive, list(inputs), params, list(outputs), node.source,
                node.stage, node.ipu)


def _with_held_subgraphs(node):
    """node's params with its sub-graphs viewed as held, or None if none
    changes."""
    params = dict(node.params)
    changed = False
    for key in node.primitive.subgraph_params:
        value = params[key]
        if isinstance(value, Graph):
            held = as_held(value)
            changed |= held is not value
        else:
            held = tuple(as_held(g) for g in value)
            changed |= any(a is not b for a, b in zip(held, value))
        params[key] = held
    return params if changed else None


def _is_square(node, step):
    """Whether chain step `step` of fused `node` squares one value: its ref."""
    prim, _, refs, _ = node.params["chain"][step]
    if prim.name == "square":
        return refs[0]
    if prim.name == "mul" and refs[0][:2] == refs[1][:2]:
        return refs[0]
    if prim.name == "pow" and refs[1][0] == "in":
        exponent = node.inputs[refs[1][1]]
        if type(exponent) is Literal:
            value = np.asarray(exponent.value)
            if value.size == 1 and float(value.reshape(())) == 2.0:
                return refs[0]
    return None


def _held_chain(node, nodes, readers, outputs, replaced):
    """(params, outputs, {dropped result: the Var its readers read}) of
    fused `node` as Poplar holds its results, or None if all are held
    (`replaced`: the results of earlier nodes already dropped, and what
    their readers read)."""
    chain, results = node.params["chain"], list(node.params["results"])
    by_step = dict(zip(results, node.outputs))
    moved = {}
    for step, var in list(by_step.items()):
        if var in outputs:
            continue
        reading = [nodes[j] for j in readers.get(var, [])]
        if not reading:
            continue
        operand = None
        if all(r.primitive.name == "reduce_sum" for r in reading):
            operand = _is_square(node, step)  # [TFSQ]
        prim, _, refs, _ = chain[step]
        if (operand is None and prim.name == "convert_element_type" and len(reading) == 1
                and reading[0].primitive.elementwise
                and reading[0].inputs.count(var) == 1):
            operand = refs[0]  # [TFEXPR]
        if operand is None:
            continue
        kind, index, aval = operand
        if kind == "in":
            moved[var] = replaced.get(node.inputs[index], node.inputs[index])
        else:
            if index not in by_step:
                by_step[index] = Var(aval)
            moved[var] = by_step[index]
        del by_step[step]
    if not moved:
        return None
    # A value standing for another dropped one (a conversion of a square).
    for var, to in list(moved.items()):
        while to in moved:
            to = moved[to]
        moved[var] = to
    order = sorted(by_step)
    params = dict(node.params, results=tuple(order))
    return params, [by_step[s] for s in order], moved
