"""Emit a keras_ipu Graph as TensorFlow ops, one rule per primitive.

    outputs = emit_graph(graph, inputs)     # inside any TensorFlow context

The shape of jax2tf: `RULES` maps a primitive's name to a function
`rule(ctx, *operands, **params)` that receives TensorFlow tensors and the
primitive's own params and returns a tensor (a tuple for primitives with
multiple results). `ctx` gives the rule the abstract values of the node
(`ctx.in_avals`, `ctx.out_avals`) and `ctx.emit(graph, args)` for the
sub-graphs control flow holds. The rules use XLA's own operations where
TensorFlow has them (`tensorflow.compiler.tf2xla.python.xla`: dot_general,
conv, reduce_window, gather, scatter, pad), so a program emitted here is
meant to be compiled by XLA (`tf.function(jit_compile=True)`); this is
what the XLA execution engine does (compiler/engines.py), and what a
SavedModel export can wrap in its own `tf.function`.

The emitter knows nothing about how the program runs: no executable, no
donation, no threads. It imports TensorFlow, so it is imported only by
what chose TensorFlow (DESIGN.md decision 10).
"""

import contextlib
import threading

import numpy as np
import tensorflow as tf

from keras_ipu.device.ir import Literal
from keras_ipu.device.ir import subgraphs
from keras_ipu.device.rule_table import rule_decorator

# name -> rule(ctx, *operands, **params); filled by the *_rules modules,
# which the package imports after this one.
RULES = {}

# Per thread: a callable emit_graph calls before each node (it raises to
# stop an emission midway; the XLA engine abandons a background compile so
# when the process exits).
_between_nodes = threading.local()


@contextlib.contextmanager
def checked_between_nodes(check):
    """Within the block, this thread's emit_graph calls `check()` before
    emitting each node, sub-graphs' nodes included."""
    _between_nodes.check = check
    try:
        yield
    finally:
        _between_nodes.check = None


class EmitError(NotImplementedError):
    """A primitive of the graph has no TensorFlow rule."""


# @rule(*names): the decorated function is the rule of those primitives.
rule = rule_decorator(RULES, "Two TensorFlow rules for {name!r}.")


class RuleContext:
    __slots__ = ("in_avals", "out_avals", "node")

    def __init__(self, node):
        self.node = node
        self.in_avals = tuple(v.aval for v in node.inputs)
        self.out_avals = tuple(v.aval for v in node.outputs)

    @property
    def out_aval(self):
        return self.out_avals[0]

    @staticmethod
    def emit(graph, args):
        return emit_graph(graph, args)


def tf_dtype(dtype):
    return tf.as_dtype(np.dtype(dtype))


def dynamic_shape(x, shape):
    """`shape` (an abstract value's) with each unknown dimension read from
    the tensor `x` at run time: a program traced with None dimensions
    (an export with a batch size left open) is emitted once for all
    sizes. Static shapes come back as they are."""
    if None not in shape:
        return tuple(shape)
    runtime = tf.shape(x)
    return [runtime[i] if d is None else d for i, d in enumerate(shape)]


def unknown_dimension_error(primitive, shape):
    return EmitError(
        f"`{primitive}` makes a value of shape {shape} with a dimension that is "
        "unknown when the program is traced and cannot be read from its "
        "operands; give the input signature fixed sizes (for example a fixed "
        "batch size) to emit it."
    )


def constant(value):
    array = np.asarray(value)
    return tf.constant(array, dtype=tf_dtype(array.dtype))


def missing_rules(graph):
    """The names of the primitives of `graph` (sub-graphs included) that
    have no TensorFlow rule: empty when the whole graph can be emitted."""
    missing = set()
    stack = [graph]
    while stack:
        g = stack.pop()
        for node in g.nodes:
            name = node.primitive.name
            if name == "fused_elementwise":
                missing.update(
                    step[0].name for step in node.params["chain"]
                    if step[0].name not in RULES
                )
                continue
            if name not in RULES:
                missing.add(name)
            stack.extend(subgraphs(node))
    return missing


def emit_graph(graph, inputs):
    """The TensorFlow tensors of `graph`'s outputs for `inputs` (one
    tensor per graph input, of its dtype and shape)."""
    if len(inputs) != len(graph.inputs):
        raise TypeError(
            f"emit_graph: the graph takes {len(graph.inputs)} inputs, got "
            f"{len(inputs)}."
        )
    env = dict(zip(graph.inputs, inputs))
    literals = {}

    def read(v):
        if type(v) is Literal:
            key = id(v.value)
            if key not in literals:
                literals[key] = constant(v.value)
            return literals[key]
        return env[v]

    check = getattr(_between_nodes, "check", None)
    for node in graph.nodes:
        if check is not None:
            check()
        name = node.primitive.name
        fn = RULES.get(name)
        if fn is None:
            raise EmitError(
                f"No TensorFlow rule for the primitive `{name}`; this program "
                "runs on the NumPy engine (KERAS_IPU_ENGINE=numpy)."
            )
        out = fn(RuleContext(node), *[read(v) for v in node.inputs], **node.params)
        if node.primitive.multiple_results:
            for v, t in zip(node.outputs, out):
                env[v] = t
        else:
            env[node.outputs[0]] = out
    return [read(v) for v in graph.outputs]

