"""The tracer: runs Python code on abstract values and records a Graph.

A Tracer stands for an array whose value is not known, only its
ShapedArray. When a primitive is bound with a Tracer among its operands, the
primitive's shape rule gives the output abstract values and a Node is
appended to the tracer's graph; concrete operands become Literals.

`trace_flat(fn, avals)` is the entry point: it returns the Graph of `fn`
and the outer values it captured. The backend gives Tracers the same
operators and attributes as its eager Tensor, so Keras code runs unchanged
on them.

Traces nest: a builder made while another trace runs (a cond branch, a
loop body, a shape inference inside a compiled step) is a child of it. A
child may use its ancestors' Tracers (closures); it captures them as extra
graph inputs (closure conversion), and the control-flow primitive passes
the outer values in for them. A primitive applied to outer Tracers inside
a child records its node in the child, the innermost running trace.
"""

import contextlib

import numpy as np

from keras_ipu.device.ir import Graph
from keras_ipu.device.ir import Literal
from keras_ipu.device.ir import Node
from keras_ipu.device.ir import Var
from keras_ipu.device.ir import forward_array_attributes
from keras_ipu.device.thread_stack import ThreadStack


class TracerConversionError(TypeError):
    pass


@forward_array_attributes("aval")
class Tracer:
    __slots__ = ("aval", "var", "builder", "__weakref__")

    # numpy must defer to our operators (x_np + tracer -> tracer.__radd__).
    __array_priority__ = 100

    def __init__(self, builder, var):
        self.builder = builder
        self.var = var
        self.aval = var.aval

    def __len__(self):
        if not self.aval.shape:
            raise TypeError("len() of a 0-d traced array")
        n = self.aval.shape[0]
        if n is None:
            raise TracerConversionError(
                "len() of a traced array whose first dimension is unknown "
                "(None). Use keras.ops.shape(x)[0] instead."
            )
        return n

    def _concrete_error(self, what):
        made_by = next((n for n in reversed(self.builder.graph.nodes)
                        if self.var in n.outputs), None)
        return TracerConversionError(
            f"{what} needs the value of a traced array {self.aval.short()}"
            f"{in_layer(made_by.source if made_by else None)}, which is only "
            "known when the compiled program runs. Use keras.ops.cond / "
            "keras.ops.where instead of Python control flow on tensor values, "
            "or run the function eagerly."
        )

    def __bool__(self):
        raise self._concrete_error("bool()")

    def __int__(self):
        raise self._concrete_error("int()")

    def __float__(self):
        raise self._concrete_error("float()")

    def __index__(self):
        raise self._concrete_error("Using a tensor as an index")

    def __array__(self, dtype=None, copy=None):
        raise self._concrete_error("Converting to a NumPy array")

    def __repr__(self):
        return f"Tracer<{self.aval.short()}>"

    def __iter__(self):
        n = len(self)
        return (self[i] for i in range(n))


_RUNNING = object()


class GraphBuilder:
    """Records the Nodes of one traced function.

    A builder started while another trace is running is nested in it
    (`parent`): the function it traces (a cond branch, a loop body) may use
    the enclosing trace's Tracers as closures. Such a value is captured:
    it becomes an extra input of this graph (after the explicit inputs), and
    `captures` lists the outer Tracers to pass for them, in that order.
    """

    def __init__(self, parent=_RUNNING):
        self.graph = Graph()
        # By default a builder nests in the trace running when it is made.
        self.parent = current_builder() if parent is _RUNNING else parent
        self.captures = []
        self._captured_vars = {}

    def nested_in(self, other):
        """Whether `other` is this builder or one of its enclosing builders."""
        b = self
        while b is not None:
            if b is other:
                return True
            b = b.parent
        return False

    def new_input(self, aval):
        var = Var(aval)
        self.graph.inputs.append(var)
        return Tracer(self, var)

    def _capture(self, tracer):
        var = self._captured_vars.get(id(tracer.var))
        if var is None:
            var = Var(tracer.aval)
            self._captured_vars[id(tracer.var)] = var
            self.graph.inputs.append(var)
            self.captures.append(tracer)
        return var

    def operand(self, x):
        if isinstance(x, Tracer):
            if x.builder is self:
                return x.var
            if self.nested_in(x.builder):
                return self._capture(x)
            raise TracerConversionError(
                f"A traced value {x.aval.short()} from a traced function that "
                "has already returned (or from an unrelated trace) was used "
                "here. Return it from that function, or pass it in as an "
                "argument, instead of keeping it in a Python variable."
            )
        return Literal(x)

    def add(self, primitive, args, params, out_avals, source=None):
        ins = [self.operand(a) for a in args]
        outs = [Var(a) for a in out_avals]
        if source is None:
            source = current_source()
        self.graph.nodes.append(Node(primitive, ins, params, outs, source, current_stage()))
        return [Tracer(self, v) for v in outs]


# Where a recorded node came from (a Keras layer path such as
# "sequential/dense_1"), for memory and profile reports. The device layer
# knows nothing of Keras: the backend installs the provider.
def _no_source():
    return None


_source_provider = _no_source
_source_override = []
_source_default = []


def current_source():
    """The source of a node recorded now (or None): the innermost
    source_scope's, else the layer the provider names, else the innermost
    default_source's."""
    source = _source_override[-1] if _source_override else _source_provider()
    if source is None and _source_default:
        source = _source_default[-1]
    return source


def in_layer(source):
    """' (in Keras layer ...)' for an error message, or '' without a source."""
    return f" (in Keras layer {source!r})" if source else ""


def set_source_provider(provider):
    """`provider()` -> the source of nodes recorded now (or None)."""
    global _source_provider
    _source_provider = provider or _no_source


class BackwardSource(str):
    """The source of a node the autodiff recorded for a backward pass: the
    Keras layer path of the forward node it differentiates (it compares and
    prints as that path, so reports are unchanged); its type records that
    the node computes cotangents, which the recomputation pass
    (compiler/recompute.py) needs to tell forward from backward."""

    __slots__ = ()

    def __reduce__(self):
        return (BackwardSource, (str(self),))


def backward_source(source):
    """`source` marked as the source of a backward-pass node."""
    return source if type(source) is BackwardSource else BackwardSource(source or "")


def is_backward(source):
    return type(source) is BackwardSource


@contextlib.contextmanager
def default_source(source):
    """Nodes recorded inside that no layer claims get `source` (None: back
    to no source): the device loop names its own scan this way, without
    renaming the layers traced in its body."""
    _source_default.append(source)
    try:
        yield
    finally:
        _source_default.pop()


@contextlib.contextmanager
def source_scope(source):
    """Nodes recorded inside get `source` (autodiff: a backward node comes
    from the layer of the forward node it differentiates)."""
    _source_override.append(source)
    try:
        yield
    finally:
        _source_override.pop()


# The pipeline stage of the nodes recorded now, per thread (a stage's
# layers called inside stage_scope(s)); the placement pass puts them on
# that stage.
_stages = ThreadStack()


def current_stage():
    """The pipeline stage of a node recorded now, or None."""
    return _stages.top()


def stage_scope(stage):
    """Nodes recorded inside run on pipeline stage `stage` (None: as the
    placement decides): a layer invocation's stage, whatever its path, so a
    layer shared by two stages runs in each."""
    return _stages.pushed(stage)


@contextlib.contextmanager
def node_scope(node, backward=False):
    """Nodes recorded inside come from where `node` did: its source and its
    stage (an inlined graph's nodes; with `backward`, the autodiff's nodes
    computing its cotangents: their source is marked, BackwardSource)."""
    _source_override.append(backward_source(node.source) if backward else node.source)
    try:
        with _stages.pushed(node.stage):
            yield
    finally:
        _source_override.pop()


def innermost_builder(args):
    """The builder a primitive applied to `args` records into.

    It is the running trace when every Tracer operand comes from it or from
    a trace enclosing it; otherwise the deepest builder among the operands.
    """
    builders = []
    for a in args:
        if isinstance(a, Tracer) and all(a.builder is not b for b in builders):
            builders.append(a.builder)
    if not builders:
        return None
    current = current_builder()
    if current is not None and all(current.nested_in(b) for b in builders):
        return current
    deepest = builders[0]
    for b in builders[1:]:
        if b.nested_in(deepest):
            deepest = b
    return deepest


# The traces running on this thread, innermost last.
_builders = ThreadStack()


def current_builder():
    return _builders.top()


def tracing(builder):
    return _builders.pushed(builder)


def trace_flat(fn, in_avals):
    """Trace `fn(*tracers)`, which returns a flat list of arrays.

    Returns (graph, captures): the graph's inputs are one Var per aval in
    `in_avals`, then one per captured outer Tracer (`captures`, in order);
    its outputs are fn's results. Results that are not traced (constants,
    captured outer values) are still graph outputs, so the graph always
    computes every result from its inputs.
    """
    builder = GraphBuilder()
    tracers = [builder.new_input(a) for a in in_avals]
    with tracing(builder):
        outs = list(fn(*tracers))
        builder.graph.outputs = [builder.operand(o) for o in outs]
    return builder.graph, builder.captures


def is_tracer(x):
    return isinstance(x, Tracer)


def concrete_value(x):
    """The NumPy value of x, or a clear error if x is traced."""
    if isinstance(x, Tracer):
        raise x._concrete_error("This operation")
    return np.asarray(x)
