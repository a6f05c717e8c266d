"""Common-subexpression elimination: a node with the same primitive, the
same operands and equal params as an earlier node reuses its outputs.

Literals compare by value when small (two `0.0` scalars are the same
operand), by identity when large (hashing big constants is not worth it).
Random primitives are included: they are pure functions of their key.
"""

import numpy as np

from keras_ipu.device.compiler.graph_utils import copy_node
from keras_ipu.device.compiler.graph_utils import freeze_params
from keras_ipu.device.compiler.graph_utils import rebuilt
from keras_ipu.device.compiler.graph_utils import substitute
from keras_ipu.device.ir import Literal

_SMALL_LITERAL = 64  # elements


def _operand_key(operand):
    if type(operand) is not Literal:
        return operand
    value = np.asarray(operand.value)
    if value.size <= _SMALL_LITERAL:
        return ("literal", value.dtype.str, value.shape, value.tobytes())
    return ("literal-id", id(operand.value))


def eliminate_common_subexpressions(graph):
    env = {}
    seen = {}
    nodes = []
    for node in graph.nodes:
        inputs = [substitute(v, env) for v in node.inputs]
        try:
            key = (
                node.primitive.name,
                node.ipu,  # the same value on another IPU is computed there
                tuple(_operand_key(v) for v in inputs),
                freeze_params(node.params),
            )
            hash(key)
        except TypeError:
            key = None
        earlier = seen.get(key) if key is not None else None
        if earlier is not None:
            for old, new in zip(node.outputs, earlier.outputs):
                env[old] = new
            continue
        new_node = copy_node(node, inputs)
        if key is not None:
            seen[key] = new_node
        nodes.append(new_node)
    return rebuilt(graph, nodes, env)
