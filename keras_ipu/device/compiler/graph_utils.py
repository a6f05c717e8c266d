"""Small helpers the passes share: operand substitution, rebuilding a
graph, sub-graphs in params, and hashable keys for params (CSE,
fingerprints). Who reads and makes each value: liveness.py."""

import numpy as np

from keras_ipu.device.ir import Graph
from keras_ipu.device.ir import Literal
from keras_ipu.device.ir import Node
from keras_ipu.device.ir import ShapedArray


def substitute(operand, env):
    """The operand that replaces `operand` (a Var may map to another Var or
    to a Literal); Literals and unmapped Vars stay."""
    if type(operand) is Literal:
        return operand
    return env.get(operand, operand)


def is_literal_of(operand, value):
    """Whether `operand` is a one-element Literal equal to `value`."""
    if type(operand) is not Literal:
        return False
    array = np.asarray(operand.value)
    return array.size == 1 and bool(array == value)


def rebuilt(graph, nodes, env):
    """A new Graph with graph's inputs, `nodes`, and outputs substituted."""
    out = Graph()
    out.inputs = list(graph.inputs)
    out.nodes = list(nodes)
    out.outputs = [substitute(v, env) for v in graph.outputs]
    return out


def copy_node(node, inputs, params=None, outputs=None, primitive=None):
    """A node like `node` (its source and placement kept) with other
    operands, and maybe other params, outputs or primitive."""
    return Node(
        node.primitive if primitive is None else primitive,
        inputs,
        node.params if params is None else params,
        node.outputs if outputs is None else outputs,
        node.source,
        node.stage,
        node.ipu,
    )


def map_subgraphs(node, fn, params=None):
    """`params` (default: node's) with every sub-graph g its primitive runs
    (subgraph_params) replaced by fn(g)."""
    out = dict(node.params if params is None else params)
    for key in node.primitive.subgraph_params:
        value = out[key]
        out[key] = fn(value) if isinstance(value, Graph) else tuple(fn(g) for g in value)
    return out


def freeze(value, graph_key=id, other_key=id):
    """A hashable key equal for params that are interchangeable.

    Types are part of the key (1, 1.0 and True are different params) and
    floats compare by repr (0.0 and -0.0 differ). Graphs map through
    `graph_key`, unknown objects through `other_key`.
    """
    if value is None or isinstance(value, (bool, int, str, bytes)):
        return (type(value).__name__, value)
    if isinstance(value, float):
        return ("float", repr(value))
    if isinstance(value, np.dtype):
        return ("dtype", value.str)
    if isinstance(value, type) and issubclass(value, np.generic):
        return ("dtype", np.dtype(value).str)
    if isinstance(value, np.generic):
        return ("scalar", value.dtype.str, repr(value.item()))
    if isinstance(value, (tuple, list)):
        return (
            type(value).__name__,
            tuple(freeze(v, graph_key, other_key) for v in value),
        )
    if isinstance(value, dict):
        return (
            "dict",
            tuple(
                (k, freeze(v, graph_key, other_key))
                for k, v in sorted(value.items(), key=lambda kv: repr(kv[0]))
            ),
        )
    if isinstance(value, np.ndarray):
        data = np.ascontiguousarray(value)
        return ("array", data.dtype.str, data.shape, data.tobytes())
    if isinstance(value, Graph):
        return ("graph", graph_key(value))
    if isinstance(value, ShapedArray):
        return ("aval", value.shape, value.dtype.str)
    return ("object", type(value).__qualname__, other_key(value))


def freeze_params(params, graph_key=id, other_key=id):
    return tuple(
        (k, freeze(v, graph_key, other_key)) for k, v in sorted(params.items())
    )
