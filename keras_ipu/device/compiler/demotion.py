"""Demotion of 64-bit values (IPU rule): the IPU has no float64 or int64,
so compiled programs compute them as float32 / int32.

Graph inputs, node outputs, Literals and dtype params (convert_element_type
to float64, iota of int64, ...) are demoted, in sub-graphs too; then every
node's output avals are re-derived with its shape rule, so the demoted
graph is checked, not just relabelled. What was demoted is appended to
`notes`; the compile pipeline turns the notes into ONE warning.
"""

import numpy as np

from keras_ipu.device.compiler.graph_utils import map_subgraphs
from keras_ipu.device.compiler.graph_utils import subgraphs
from keras_ipu.device.ir import Graph
from keras_ipu.device.ir import Literal
from keras_ipu.device.ir import Node
from keras_ipu.device.ir import ShapedArray
from keras_ipu.device.ir import Var

DEMOTED = {
    np.dtype(np.float64): np.dtype(np.float32),
    np.dtype(np.int64): np.dtype(np.int32),
}


class DemotionWarning(UserWarning):
    pass


def _demote_dtype(dtype):
    return DEMOTED.get(dtype, dtype)


def _demote_aval(aval):
    return ShapedArray(aval.shape, _demote_dtype(aval.dtype))


def _needs_demotion_value(value):
    if isinstance(value, np.dtype):
        return value in DEMOTED
    if isinstance(value, type) and issubclass(value, np.generic):
        return np.dtype(value) in DEMOTED
    if isinstance(value, ShapedArray):
        return value.dtype in DEMOTED
    if isinstance(value, Graph):
        return needs_demotion(value)
    if isinstance(value, tuple):
        return any(_needs_demotion_value(v) for v in value)
    return False


def needs_demotion(graph):
    vars_ = list(graph.inputs)
    for node in graph.nodes:
        vars_.extend(node.outputs)
        vars_.extend(node.inputs)
        if any(_needs_demotion_value(v) for v in node.params.values()):
            return True
    vars_.extend(graph.outputs)
    return any(v.aval.dtype in DEMOTED for v in vars_)


def _demote_param(value, notes, where):
    if isinstance(value, np.dtype) and value in DEMOTED:
        notes.append(f"{where}: dtype {value.name}")
        return DEMOTED[value]
    if isinstance(value, type) and issubclass(value, np.generic):
        if np.dtype(value) in DEMOTED:
            notes.append(f"{where}: dtype {np.dtype(value).name}")
            return DEMOTED[np.dtype(value)].type
        return value
    if isinstance(value, ShapedArray) and value.dtype in DEMOTED:
        return _demote_aval(value)
    if isinstance(value, tuple):
        return tuple(_demote_param(v, notes, where) for v in value)
    return value


def _demote_literal(lit, notes, where):
    if lit.aval.dtype not in DEMOTED:
        return lit
    notes.append(f"{where}: constant {lit.aval.short()}")
    value = np.asarray(lit.value)
    with np.errstate(all="ignore"):
        return Literal(value.astype(DEMOTED[value.dtype]))


def demote_64bit(graph, notes=None):
    """The graph computing in 32 bits. `notes` (a list) collects what changed."""
    notes = [] if notes is None else notes
    if not needs_demotion(graph):
        return graph
    env = {}
    out = Graph()
    for i, var in enumerate(graph.inputs):
        new = Var(_demote_aval(var.aval))
        if var.aval.dtype in DEMOTED:
            notes.append(f"input {i}: {var.aval.short()}")
        env[var] = new
        out.inputs.append(new)

    def operand(v, where):
        if type(v) is Literal:
            return _demote_literal(v, notes, where)
        return env[v]

    for node in graph.nodes:
        name = node.primitive.name
        inputs = [operand(v, name) for v in node.inputs]
        params = {k: _demote_param(v, notes, name) for k, v in node.params.items()}
        if any(True for _ in subgraphs(params)):
            params = map_subgraphs(params, lambda g: demote_64bit(g, notes))
        try:
            avals = node.primitive.abstract_eval(*(v.aval for v in inputs), **params)
        except Exception as e:
            raise TypeError(
                f"Demoting 64-bit values to 32 bits (IPU rule) made `{name}` "
                f"invalid: {e}. Cast to float32/int32 before this op."
            ) from e
        if not node.primitive.multiple_results:
            avals = (avals,)
        outputs = [Var(a) for a in avals]
        for old, new in zip(node.outputs, outputs):
            if old.aval.dtype in DEMOTED:
                notes.append(f"{name}: {old.aval.short()}")
            env[old] = new
        out.nodes.append(Node(node.primitive, inputs, params, outputs, node.source))
    out.outputs = [operand(v, "output") for v in graph.outputs]
    return out


def demotion_message(notes):
    shown = "; ".join(dict.fromkeys(notes))
    if len(shown) > 400:
        shown = shown[:400] + " ..."
    return (
        f"The IPU has no 64-bit types: {len(notes)} float64/int64 value(s) "
        f"of this program are computed as float32/int32 ({shown}). Cast to "
        "32 bits yourself to silence this warning, or compute in 64 bits "
        "outside the compiled function."
    )
