"""Control flow: while, conditional, call.

HLO loops and branches become the while_loop and cond primitives with
their computations traced as sub-graphs (the compiler compiles them
recursively). A computation with side effects gets the effect token as one
more loop variable or branch operand, so effects inside loops stay ordered
and run once per iteration. `call` is inlined.
"""

import numpy as np

from keras_ipu.device.primitives import control_flow as cf
from keras_ipu.device.primitives import convert as cv
from keras_ipu.device.primitives import elementwise as ew
from keras_ipu.device.trace import current_builder
from keras_ipu.frontends.tensorflow.importer import HloImportError
from keras_ipu.frontends.tensorflow.importer import flatten_value
from keras_ipu.frontends.tensorflow.importer import rule
from keras_ipu.frontends.tensorflow.importer import unflatten_value
from keras_ipu.frontends.tensorflow.opcodes.shapes import scalar_index

# HloInstruction's called computations: a while's body first, then its
# condition.
_BODY, _CONDITION = 0, 1


def _bind_control(imp, prim, *args, **params):
    """Control flow is always recorded (never run at import time)."""
    args = [imp.raw(a) for a in args]
    return prim.bind_traced(current_builder(), *args, **params)


@rule("while")
def _while(imp, instr, operands):
    (init,) = operands
    body = imp.called(instr, _BODY)
    condition = imp.called(instr, _CONDITION)
    effects = imp.has_effects(body) or imp.has_effects(condition)
    leaves, structure = flatten_value(init)
    leaves = [imp.array(v) for v in leaves]
    body_graph, body_caps, out_structure = imp.trace_computation(body, [init], effects)
    cond_graph, cond_caps, _ = _trace_condition(imp, condition, init, effects)
    if out_structure != structure:
        raise HloImportError(
            f"the while body {body.name!r} returns a value shaped unlike the loop state."
        )
    carry = leaves + ([imp.token] if effects else [])
    outs = _bind_control(imp, cf.while_p, *carry, *cond_caps, *body_caps,
                         cond_graph=cond_graph, body_graph=body_graph,
                         n_cond_consts=len(cond_caps))
    outs = list(outs)
    if effects:
        imp.token = outs.pop()
    return unflatten_value(structure, outs)


def _trace_condition(imp, condition, init, effects):
    """The condition as a graph over the loop state (and token) returning
    one boolean scalar (the condition may return a 1-tuple)."""
    graph, caps, structure = imp.trace_computation(condition, [init], effects)
    if effects:
        graph.outputs = graph.outputs[:-1]  # the condition's token is unused
    if len(graph.outputs) != 1:
        raise HloImportError(f"the while condition {condition.name!r} must return one boolean.")
    return graph, caps, structure


@rule("conditional")
def _conditional(imp, instr, operands):
    selector, *branch_operands = operands
    branches = [imp.computation(c) for c in instr.called_computation_ids]
    selector = scalar_index(imp, selector)
    if np.dtype(selector.dtype) == np.bool_:
        if len(branches) != 2:
            raise HloImportError("a boolean conditional needs two branches.")
        # Branches are (true, false); the cond primitive picks by index.
        index = imp.bind(ew.select_p, selector, np.int32(0), np.int32(1))
    else:
        n = len(branches)
        index = imp.bind(cv.convert_element_type_p, selector, dtype=np.dtype(np.int32))
        # XLA runs the last branch for an index out of range.
        out_of_range = imp.bind(ew.or_p, imp.bind(ew.lt_p, index, np.int32(0)),
                                imp.bind(ew.ge_p, index, np.int32(n)))
        index = imp.bind(ew.select_p, out_of_range, np.int32(n - 1), index)
    effects = any(imp.has_effects(b) for b in branches)
    flat = []
    spans = []
    for op in branch_operands:
        leaves, structure = flatten_value(op)
        spans.append((len(flat), len(leaves), structure))
        flat.extend(imp.array(v) for v in leaves)
    graphs, captures, out_structures = [], [], []
    for k, branch in enumerate(branches):
        start, count, structure = spans[k]
        graph, caps, out_structure = _trace_branch(imp, branch, flat, start, count,
                                                   structure, effects)
        graphs.append(graph)
        captures.append(caps)
        out_structures.append(out_structure)
    union = _align_captures(graphs, captures)
    args = flat + ([imp.token] if effects else []) + union
    outs = list(_bind_control(imp, cf.cond_p, index, *args, branches=tuple(graphs)))
    if effects:
        imp.token = outs.pop()
    return unflatten_value(out_structures[0], outs)


def _trace_branch(imp, branch, flat, start, count, structure, effects):
    """A branch traced over every branch's operand leaves (cond branches
    take the same operands); it reads its own span."""
    from keras_ipu.device.ir import aval_of

    return imp.trace_sub_graph(
        [aval_of(imp.raw(v)) for v in flat], effects,
        lambda tracers: imp.run(branch, [unflatten_value(structure, tracers[start:start + count])]))


def _align_captures(graphs, captures):
    """Every branch graph takes the union of all branches' captures."""
    from keras_ipu.device.ir import Var

    union, seen = [], {}
    for caps in captures:
        for c in caps:
            if id(c.var) not in seen:
                seen[id(c.var)] = len(union)
                union.append(c)
    for graph, caps in zip(graphs, captures):
        n_explicit = len(graph.inputs) - len(caps)
        own = dict(zip((id(c.var) for c in caps), graph.inputs[n_explicit:]))
        graph.inputs = graph.inputs[:n_explicit] + [
            own.get(id(c.var)) or Var(c.aval) for c in union]
    return union


@rule("call")
def _call(imp, instr, operands):
    return imp.run(imp.called(instr), list(operands))
