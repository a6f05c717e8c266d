"""Demotion of 64-bit values (IPU rule): the IPU has no float64 or int64,
so compiled programs compute them as float32 / int32.

Graph inputs, node outputs, Literals and dtype params (convert_element_type
to float64, iota of int64, ...) are demoted, in sub-graphs too; then every
node's output avals are re-derived with its shape rule, so the demoted
graph is checked, not just relabelled. What was demoted is appended to
`notes`; the compile pipeline turns the notes into ONE warning.

Demotion never changes a value silently:
- An int64 input that the program only converts to a float type (integer
  features of a Dense layer, integer targets of a regression loss) becomes
  an input of that float type: the host converts int64 to float directly,
  as Keras' TensorFlow backend does, instead of wrapping it to int32 first
  (3_000_000_000 stays 3e9, it does not become -1.29e9). Through a scan
  (the device loop) too: its body's input follows the operand.
- Any other int64 input is int32 on the device, and the executable checks
  the range of each such input on the host before running
  (InputRangeError names the input, the value and the fix).
"""

import numpy as np

from keras_ipu.device.compiler.graph_utils import copy_node
from keras_ipu.device.compiler.graph_utils import map_subgraphs
from keras_ipu.device.ir import Graph
from keras_ipu.device.ir import Literal
from keras_ipu.device.ir import ShapedArray
from keras_ipu.device.ir import Var
from keras_ipu.device.primitives.control_flow import scan_p

DEMOTED = {
    np.dtype(np.float64): np.dtype(np.float32),
    np.dtype(np.int64): np.dtype(np.int32),
}


class DemotionWarning(UserWarning):
    pass


class InputRangeError(OverflowError):
    """An integer input holds a value its device type (int32) cannot hold.

    `index`: the input's position among the executable's inputs; `name`:
    how the message names it (callers that know better rename it).
    """

    def __init__(self, index, value, from_dtype, to_dtype, name=None):
        self.index, self.value = index, value
        self.from_dtype, self.to_dtype = np.dtype(from_dtype), np.dtype(to_dtype)
        self.name = name or f"input {index} of the program"
        info = np.iinfo(self.to_dtype)
        super().__init__(
            f"{self.name} holds the value {value} ({self.from_dtype.name}), "
            f"outside the range of {self.to_dtype.name} ({info.min} to "
            f"{info.max}), the type the IPU computes it in (the IPU has no "
            "64-bit integers). Converting it would wrap the value, so the "
            "program did not run. Fix: if it is a numeric feature or "
            "target, cast it to float32 before passing it "
            "(`x.astype('float32')`); if it holds ids or class labels, map "
            "them into the int32 range (`np.unique(ids, return_inverse=True)`"
            ", or a keras.layers.Hashing / IntegerLookup layer)."
        )

    def renamed(self, name):
        return InputRangeError(
            self.index, self.value, self.from_dtype, self.to_dtype, name
        )


def check_integer_range(index, x, dtype):
    """Raise InputRangeError when the integer array `x` has a value outside
    the range of the integer `dtype` it is about to be converted to."""
    if not x.size or np.can_cast(x.dtype, dtype, "safe"):
        return
    info = np.iinfo(dtype)
    low, high = x.min(), x.max()
    if high > info.max:
        raise InputRangeError(index, int(high), x.dtype, dtype)
    if low < info.min:
        raise InputRangeError(index, int(low), x.dtype, dtype)


_INT64 = np.dtype(np.int64)
_HOST_FLOATS = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))


def _float_only(graph, var):
    """The float dtype `var` (an int64 value) is only ever converted to in
    `graph`, directly or as a scan's xs/const operand whose body input is
    float-only too; None if it is used any other way."""
    if any(out is var for out in graph.outputs):
        return None
    found = set()
    for node in graph.nodes:
        for position, operand in enumerate(node.inputs):
            if operand is not var:
                continue
            name = node.primitive.name
            if name == "convert_element_type":
                dtype = np.dtype(node.params["dtype"])
                if dtype not in _HOST_FLOATS:
                    return None
                found.add(_demote_dtype(dtype))
            elif name == "scan" and position >= node.params["n_carry"]:
                body = node.params["body"]
                dtype = _float_only(body, body.inputs[position])
                if dtype is None:
                    return None
                found.add(dtype)
            else:
                return None
    return found.pop() if len(found) == 1 else None


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


def _input_aval(graph, i, var, notes, input_dtypes):
    if input_dtypes and i in input_dtypes:  # a scan body following its operand
        return ShapedArray(var.aval.shape, input_dtypes[i])
    if var.aval.dtype == _INT64:
        dtype = _float_only(graph, var)
        if dtype is not None:  # what the program does with it: no note
            return ShapedArray(var.aval.shape, dtype)
    if var.aval.dtype in DEMOTED:
        notes.append(f"input {i}: {var.aval.short()}")
    return _demote_aval(var.aval)


def _scan_body_dtypes(node, inputs):
    """Body inputs of a scan whose operand became a float while the body
    still reads an int64 (see _float_only)."""
    body = node.params["body"]
    return {
        position: operand.aval.dtype
        for position, (operand, body_input) in enumerate(zip(inputs, body.inputs))
        if body_input.aval.dtype == _INT64 and operand.aval.dtype.kind == "f"
    }


def demote_64bit(graph, notes=None, input_dtypes=None):
    """The graph computing in 32 bits. `notes` (a list) collects what changed;
    `input_dtypes` (input index -> dtype) sets the dtype of some inputs."""
    notes = [] if notes is None else notes
    if not input_dtypes and not needs_demotion(graph):
        return graph
    env = {}
    out = Graph()
    for i, var in enumerate(graph.inputs):
        new = Var(_input_aval(graph, i, var, notes, input_dtypes))
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
        if node.primitive is scan_p:
            params["body"] = demote_64bit(
                params["body"], notes, _scan_body_dtypes(node, inputs)
            )
        else:
            params = map_subgraphs(node, lambda g: demote_64bit(g, notes), params)
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
        out.nodes.append(copy_node(node, inputs, params, outputs))
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
