"""Dead-code elimination: drop nodes none of whose outputs are used.

Every primitive is pure (random numbers come from explicit keys), so an
unused node has no effect to keep.
"""

from keras_ipu.device.compiler.graph_utils import rebuilt
from keras_ipu.device.ir import Var


def eliminate_dead_code(graph):
    live = {v for v in graph.outputs if type(v) is Var}
    kept = []
    for node in reversed(graph.nodes):
        if any(out in live for out in node.outputs):
            kept.append(node)
            live.update(v for v in node.inputs if type(v) is Var)
    kept.reverse()
    return rebuilt(graph, kept, {})
