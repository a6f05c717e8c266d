"""Emit a keras_ipu Graph as TensorFlow ops, one rule per primitive.

    outputs = emit_graph(graph, inputs, mode)     # inside any TensorFlow context

The shape of jax2tf: a rule table (`MODE_RULES[mode]`) maps a primitive's
name to a function `rule(ctx, *operands, **params)` that receives TensorFlow tensors and the
primitive's own params and returns a tensor (a tuple for primitives with
multiple results). `ctx` gives the rule the abstract values of the node
(`ctx.in_avals`, `ctx.out_avals`) and `ctx.emit(graph, args)` for the
sub-graphs control flow holds. Two modes, one rule table each (`MODES`):

- `xla` (the default): the rules use XLA's own operations where TensorFlow
  has them (`tensorflow.compiler.tf2xla.python.xla`: dot_general, conv,
  reduce_window, pad, dynamic slices), so the program is meant to be
  compiled by XLA (`tf.function(jit_compile=True)`): the XLA engine, and
  what a SavedModel export wraps in its own `tf.function`.
- `graph`: only operations with TensorFlow kernels of their own (MatMul,
  Conv2D, MaxPool, Pad, ...), so TensorFlow's graph runtime runs the
  program without XLA (the `tensorflow` engine): its oneDNN kernels and
  its inter-op pool running independent operations at once.

Most rules emit operations both runtimes have and serve both modes
(`@rule`); a primitive whose XLA rule has no graph kernels has a rule per
mode (`@xla_rule` and `@graph_rule`). A primitive without a rule in a
mode is named by `missing_rules(graph, mode)`: its program runs on
another engine.

The emitter knows nothing about how the program runs: no executable, no
donation, no threads. It imports TensorFlow, so it is imported only by
what chose TensorFlow (DESIGN.md decision 10).
"""

import contextlib
import threading

import numpy as np
import tensorflow as tf

from keras_ipu.device.compiler.dot_transpose import fold_dot_transposes
from keras_ipu.device.compiler.fusion import unfused_graph
from keras_ipu.device.compiler.graph_utils import copy_node
from keras_ipu.device.compiler.graph_utils import rebuilt
from keras_ipu.device.compiler.graph_utils import substitute
from keras_ipu.device.compiler.pad_sums import concatenate_padded_sums
from keras_ipu.device import liveness
from keras_ipu.device.ir import Literal
from keras_ipu.device.to_tensorflow import graph_patterns
from keras_ipu.device.ir import subgraphs
from keras_ipu.device.rule_table import rule_decorator

MODES = ("xla", "graph")
# mode -> {name -> rule(ctx, *operands, **params)}; filled by the *_rules
# modules, which the package imports after this one.
MODE_RULES = {mode: {} for mode in MODES}
# The XLA mode's table, the one exports use.
RULES = MODE_RULES["xla"]

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


_MODE_DECORATORS = {
    mode: rule_decorator(table, f"Two TensorFlow rules for {{name!r}} ({mode} mode).")
    for mode, table in MODE_RULES.items()
}
# @xla_rule(*names) / @graph_rule(*names): the decorated function is the
# rule of those primitives in that mode only.
xla_rule = _MODE_DECORATORS["xla"]
graph_rule = _MODE_DECORATORS["graph"]


def rule(*names):
    """@rule(*names): the decorated function is the rule of those
    primitives in every mode (it emits operations both runtimes run)."""

    def register(fn):
        for decorate in _MODE_DECORATORS.values():
            decorate(*names)(fn)
        return fn

    return register


def _check_mode(mode):
    if mode not in MODE_RULES:
        raise ValueError(f"emit mode {mode!r} is not one of {', '.join(MODES)}.")
    return MODE_RULES[mode]


class RuleContext:
    __slots__ = ("in_avals", "out_avals", "node", "mode")

    def __init__(self, node, mode):
        self.node = node
        self.mode = mode
        self.in_avals = tuple(v.aval for v in node.inputs)
        self.out_avals = tuple(v.aval for v in node.outputs)

    @property
    def out_aval(self):
        return self.out_avals[0]

    def emit(self, graph, args):
        """A sub-graph's outputs, emitted in this node's mode."""
        return emit_graph(graph, args, mode=self.mode)


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


def missing_rules(graph, mode="xla"):
    """The names of the primitives of `graph` (sub-graphs included) that
    have no TensorFlow rule in `mode`: empty when the whole graph can be
    emitted."""
    rules = _check_mode(mode)
    missing = set()
    stack = [graph]
    while stack:
        g = stack.pop()
        for node in g.nodes:
            name = node.primitive.name
            if name == "fused_elementwise":
                missing.update(
                    step[0].name for step in node.params["chain"]
                    if step[0].name not in rules
                )
                continue
            if name not in rules:
                missing.add(name)
            stack.extend(subgraphs(node))
    return missing


def _inline_chains(graph):
    """`graph` with each fused elementwise chain (compiler/fusion.py) as
    its primitives, in place: the graph runtime runs a chain op by op
    anyway, XLA fuses it again its own way, and the rewrites below then
    see through chains (a broadcast read by a chain's product, a
    softmax's parts in two chains). Both modes run it on every graph
    and sub-graph they emit, so no chain reaches the rule table
    (missing_rules reads a chain's members). Same ops, same values."""
    if not any(n.primitive.name == "fused_elementwise" for n in graph.nodes):
        return graph
    nodes, env = [], {}
    for node in graph.nodes:
        inputs = [substitute(v, env) for v in node.inputs]
        if node.primitive.name != "fused_elementwise":
            nodes.append(copy_node(node, inputs) if inputs != node.inputs else node)
            continue
        chain = unfused_graph(node.params["chain"], node.params["results"],
                              [v.aval for v in node.inputs])
        inner = dict(zip(chain.inputs, inputs))
        for step in chain.nodes:
            nodes.append(copy_node(node, [substitute(v, inner) for v in step.inputs],
                                   step.params, step.outputs, step.primitive))
        for out, result in zip(node.outputs, chain.outputs):
            env[out] = substitute(result, inner)
    return rebuilt(graph, nodes, env)


def _for_graph_runtime(graph):
    """`graph` with the NumPy lowering's two rewrites of what the autodiff
    writes (compiler/fusion.py runs them before fusing; the emitter gets
    the program before them): a product's transpose folded into the
    product, and sums of zero pads that tile an array (the gradient of
    slicing: an LSTM's four gates) as one concatenate. TensorFlow's graph
    runtime runs each op as written: per LSTM step it ran two transposes,
    four Pads and an AddN of four (128, 512) arrays where Keras'
    TensorFlow backend runs one ConcatV2 (issue 16, eighth pass). XLA
    folds the transposes into its products itself (the padded sums it
    does not: _for_xla). Values are the same (a padded sum's zeros
    can differ in sign only, as on NumPy)."""
    return concatenate_padded_sums(fold_dot_transposes(_inline_chains(graph)))


def _for_xla(graph):
    """`graph` with sums of zero pads that tile an array as one
    concatenate (pad_sums.py), as for the graph runtime. XLA keeps the
    pads: it fuses them and their sum into one loop over the result that
    tests each piece's bounds at every element. In the LSTM's backward
    scan that loop (the four gates' gradients into one (128, 512) array
    per step) took 2.4 of the 18.8 ms of the one-thread training step,
    and the step's CPU time fell by a tenth with the concatenate (issue
    16, eighteenth pass)."""
    return concatenate_padded_sums(_inline_chains(graph))


# Primitives whose rules call TensorFlow ops that broadcast their operands
# as NumPy does (right-aligned, size-1 axes stretched): AddV2, Mul,
# SelectV2, Equal, ...
IMPLICIT_BROADCAST = frozenset({
    "add", "sub", "mul", "div", "max", "min", "select",
    "eq", "ne", "lt", "le", "gt", "ge",
})


def _implicit_broadcasts(graph):
    """The broadcast_to nodes of `graph` whose result every reader would
    broadcast the same way itself: each reader is an IMPLICIT_BROADCAST
    primitive of the same result shape with another operand of that full
    shape (not itself a broadcast), and the result is no graph output.
    TensorFlow's graph runtime materialises a BroadcastTo (BatchNormalization's
    statistics broadcast to 128x32x32x32, 16 MB, in the CNN benchmark's
    backward pass); its binary kernels broadcast as they read. XLA fuses
    broadcasts itself."""
    live = liveness.analyze(graph)
    outputs = {v for v in graph.outputs if type(v) is not Literal}
    elided = set()
    for node in graph.nodes:
        if node.primitive.name != "broadcast_to":
            continue
        (v,), (x,) = node.outputs, node.inputs
        shape = v.aval.shape
        if v in outputs or None in shape or len(x.aval.shape) > len(shape):
            continue

        def full(u, v=v, shape=shape):
            if u is v or type(u) is Literal or u.aval.shape != shape:
                return False
            made_at = live.made_at.get(u)  # None: a graph input
            return made_at is None or graph.nodes[made_at].primitive.name != "broadcast_to"

        uses = [graph.nodes[i] for i in live.readers.get(v, ())]
        if uses and all(r.primitive.name in IMPLICIT_BROADCAST
                        and r.outputs[0].aval.shape == shape
                        and any(full(u) for u in r.inputs)
                        for r in uses):
            elided.add(node)
    return elided


def emit_graph(graph, inputs, mode="xla"):
    """The TensorFlow tensors of `graph`'s outputs for `inputs` (one
    tensor per graph input, of its dtype and shape), emitted with `mode`'s
    rules."""
    rules = _check_mode(mode)
    if len(inputs) != len(graph.inputs):
        raise TypeError(
            f"emit_graph: the graph takes {len(graph.inputs)} inputs, got "
            f"{len(inputs)}."
        )
    elided, overrides = (), {}
    if mode == "graph":
        graph = _for_graph_runtime(graph)
        elided = _implicit_broadcasts(graph)
        overrides = graph_patterns.overrides(graph)
    else:
        graph = _for_xla(graph)
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
        if node in elided:  # its readers broadcast the operand themselves
            env[node.outputs[0]] = read(node.inputs[0])
            continue
        if node in overrides:  # as one of TensorFlow's fused kernels
            env[node.outputs[0]] = overrides[node](read)
            continue
        name = node.primitive.name
        fn = rules.get(name)
        if fn is None:
            raise EmitError(
                f"No TensorFlow rule ({mode} mode) for the primitive `{name}`; "
                "this program runs on another engine (KERAS_IPU_ENGINE=numpy)."
            )
        out = fn(RuleContext(node, mode), *[read(v) for v in node.inputs], **node.params)
        if node.primitive.multiple_results:
            for v, t in zip(node.outputs, out):
                env[v] = t
        else:
            env[node.outputs[0]] = out
    return [read(v) for v in graph.outputs]

