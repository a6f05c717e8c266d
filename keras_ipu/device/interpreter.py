"""The graph interpreter: runs a Graph by binding its primitives in order.

`eval_graph(graph, *inputs)` binds every node's primitive to the values of
its inputs. With concrete inputs the kernels run now (the host computes the
graph); with Tracers among the inputs each bind records a node in the running
trace, so evaluating a graph inside another trace inlines it.
"""

from keras_ipu.device.ir import Literal
from keras_ipu.device.trace import _source_override


def eval_graph(graph, *inputs):
    """Values of graph.outputs (a list) for `inputs`, one per graph input."""
    if len(inputs) != len(graph.inputs):
        raise TypeError(
            f"The graph takes {len(graph.inputs)} inputs "
            f"({', '.join(v.aval.short() for v in graph.inputs)}); "
            f"got {len(inputs)}."
        )
    env = {}
    for var, value in zip(graph.inputs, inputs):
        env[var.id] = value

    def read(operand):
        if isinstance(operand, Literal):
            return operand.value
        return env[operand.id]

    # An inlined node keeps the source (Keras layer) it was traced in.
    sources = _source_override
    for node in graph.nodes:
        args = [read(v) for v in node.inputs]
        sources.append(node.source)
        try:
            outs = node.primitive.bind(*args, **node.params)
        finally:
            sources.pop()
        if not node.primitive.multiple_results:
            outs = (outs,)
        for var, value in zip(node.outputs, outs):
            env[var.id] = value
    return [read(v) for v in graph.outputs]
