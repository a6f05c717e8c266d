"""Constant folding: a node whose operands are all Literals is evaluated at
compile time and its outputs become Literals.

Not folded: random primitives (seeds must stay runtime values, design
decision 6), collectives (their value depends on the other replicas), value-dependent shapes, nodes with sub-graphs (control flow
runs its own programs), and results bigger than `limit_bytes` (a huge
constant costs device memory; the computation that makes it does not).
"""

import numpy as np

from keras_ipu.device.compiler.graph_utils import copy_node
from keras_ipu.device.compiler.graph_utils import rebuilt
from keras_ipu.device.compiler.graph_utils import substitute
from keras_ipu.device.ir import Literal

DEFAULT_LIMIT_BYTES = 1 << 20


def _foldable(node, inputs, limit_bytes):
    prim = node.primitive
    if prim.dynamic_shape or prim.runtime_value or prim.subgraph_params:
        return False
    if any(type(v) is not Literal for v in inputs):
        return False
    total = 0
    for var in node.outputs:
        nbytes = var.aval.nbytes
        if nbytes is None:
            return False
        total += nbytes
    return total <= limit_bytes


def _evaluate(node, inputs):
    values = [np.asarray(v.value) for v in inputs]
    with np.errstate(all="ignore"):
        out = node.primitive.kernel(*values, **node.params)
    outs = tuple(out) if node.primitive.multiple_results else (out,)
    results = []
    for var, value in zip(node.outputs, outs):
        value = np.asarray(value)
        if value.shape != var.aval.shape or value.dtype != var.aval.dtype:
            return None  # a kernel disagreeing with its rule: leave it to runtime
        results.append(value)
    return results


def fold_constants(graph, limit_bytes=DEFAULT_LIMIT_BYTES):
    env = {}
    nodes = []
    for node in graph.nodes:
        inputs = [substitute(v, env) for v in node.inputs]
        if _foldable(node, inputs, limit_bytes):
            try:
                values = _evaluate(node, inputs)
            except Exception:  # noqa: BLE001 - the runtime will report it
                values = None
            if values is not None:
                for var, value in zip(node.outputs, values):
                    env[var] = Literal(value)
                continue
        nodes.append(copy_node(node, inputs))
    return rebuilt(graph, nodes, env)
