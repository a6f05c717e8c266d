"""The graph interpreter: runs a Graph by binding its primitives in order.

`eval_graph(graph, *inputs)` binds every node's primitive to the values of
its inputs. With concrete inputs the kernels run now (the host computes the
graph); with Tracers among the inputs each bind records a node in the running
trace, so evaluating a graph inside another trace inlines it.

`evaluate` is the walk itself, for callers that need every value (the
autodiff keeps them as residuals) or apply some nodes their own way.
"""

from keras_ipu.device.ir import Literal
from keras_ipu.device.trace import node_scope


def read(env, operand):
    """The value of a Var (from `env`, by Var id) or of a Literal."""
    if type(operand) is Literal:
        return operand.value
    return env[operand.id]


def bind_node(index, node, args):
    """The outputs (a tuple) of `node` applied to `args`."""
    outs = node.primitive.bind(*args, **node.params)
    return outs if node.primitive.multiple_results else (outs,)


def evaluate(graph, inputs, apply=bind_node, read_operand=read):
    """Every value of `graph` on `inputs`: {Var id: value}. Each node runs as
    apply(index, node, args) -> its outputs, inside the node's scope (an
    inlined node keeps the Keras layer and stage it was traced in)."""
    if len(inputs) != len(graph.inputs):
        raise TypeError(
            f"The graph takes {len(graph.inputs)} inputs "
            f"({', '.join(v.aval.short() for v in graph.inputs)}); "
            f"got {len(inputs)}."
        )
    env = {var.id: value for var, value in zip(graph.inputs, inputs)}
    for index, node in enumerate(graph.nodes):
        args = [read_operand(env, v) for v in node.inputs]
        with node_scope(node):
            outs = apply(index, node, args)
        for var, value in zip(node.outputs, outs):
            env[var.id] = value
    return env


def eval_graph(graph, *inputs):
    """Values of graph.outputs (a list) for `inputs`, one per graph input."""
    env = evaluate(graph, inputs)
    return [read(env, v) for v in graph.outputs]
