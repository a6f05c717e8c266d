"""Hand-built graphs for the compiler's pass tests and the simulator's cost
and memory tests.

`build(in_avals, body)` makes a Graph whose nodes `body(b, *inputs)` adds
with `b.op(primitive, *operands, **params)`; operands are Vars or
`lit(value)` Literals, so nodes with Literal-only operands (which an eager
bind would run at once) can be written too.
"""

import numpy as np

from keras_ipu.device.ir import Graph
from keras_ipu.device.ir import Literal
from keras_ipu.device.ir import Node
from keras_ipu.device.ir import ShapedArray
from keras_ipu.device.ir import Var
from keras_ipu.device.primitives import REGISTRY


def aval(shape, dtype="float32"):
    return ShapedArray(shape, dtype)


def lit(value, dtype=None):
    return Literal(np.asarray(value, dtype=dtype))


class Builder:
    def __init__(self, graph):
        self.graph = graph

    def op(self, name, *operands, source=None, **params):
        prim = REGISTRY[name]
        avals = prim.abstract_eval(*(o.aval for o in operands), **params)
        if not prim.multiple_results:
            avals = (avals,)
        outs = [Var(a) for a in avals]
        self.graph.nodes.append(Node(prim, list(operands), params, outs, source))
        return outs if prim.multiple_results else outs[0]


def build(in_avals, body):
    graph = Graph()
    graph.inputs = [Var(a) for a in in_avals]
    outs = body(Builder(graph), *graph.inputs)
    graph.outputs = list(outs) if isinstance(outs, (list, tuple)) else [outs]
    return graph


def prim_names(graph):
    return [n.primitive.name for n in graph.nodes]


def run(graph, *inputs):
    from keras_ipu.device.interpreter import eval_graph

    return [np.asarray(v) for v in eval_graph(graph, *inputs)]
