"""The tracer: runs Python code on abstract values and records a Graph.

A Tracer stands for an array whose value is not known, only its
ShapedArray. When a primitive is bound with a Tracer among its operands, the
primitive's shape rule gives the output abstract values and a Node is
appended to the tracer's graph; concrete operands become Literals.

`trace(fn, avals)` is the entry point: it returns the Graph of `fn` and the
output structure. The backend gives Tracers the same operators and
attributes as its eager Tensor, so Keras code runs unchanged on them.
"""

import contextlib
import threading

import numpy as np

from keras_ipu.device.ir import Graph
from keras_ipu.device.ir import Literal
from keras_ipu.device.ir import Node
from keras_ipu.device.ir import Var


class TracerConversionError(TypeError):
    pass


class Tracer:
    __slots__ = ("aval", "var", "builder", "__weakref__")

    # numpy must defer to our operators (x_np + tracer -> tracer.__radd__).
    __array_priority__ = 100

    def __init__(self, builder, var):
        self.builder = builder
        self.var = var
        self.aval = var.aval

    @property
    def shape(self):
        return self.aval.shape

    @property
    def dtype(self):
        return self.aval.dtype

    @property
    def ndim(self):
        return self.aval.ndim

    @property
    def size(self):
        return self.aval.size

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
        return TracerConversionError(
            f"{what} needs the value of a traced array {self.aval.short()}, "
            "which is only known when the compiled program runs. Use "
            "keras.ops.cond / keras.ops.where instead of Python control flow "
            "on tensor values, or run the function eagerly."
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


class GraphBuilder:
    def __init__(self):
        self.graph = Graph()
        self._literal_vars = {}

    def new_input(self, aval):
        var = Var(aval)
        self.graph.inputs.append(var)
        return Tracer(self, var)

    def operand(self, x):
        if isinstance(x, Tracer):
            if x.builder is not self:
                raise TracerConversionError(
                    "A traced value from another traced function was used "
                    "here. Pass it in as an argument instead of capturing it."
                )
            return x.var
        return Literal(x)

    def add(self, primitive, args, params, out_avals, source=None):
        ins = [self.operand(a) for a in args]
        outs = [Var(a) for a in out_avals]
        self.graph.nodes.append(Node(primitive, ins, params, outs, source))
        return [Tracer(self, v) for v in outs]


_state = threading.local()


def current_builder():
    stack = getattr(_state, "stack", None)
    return stack[-1] if stack else None


@contextlib.contextmanager
def tracing(builder):
    stack = getattr(_state, "stack", None)
    if stack is None:
        stack = _state.stack = []
    stack.append(builder)
    try:
        yield builder
    finally:
        stack.pop()


def find_builder(args):
    for a in args:
        if type(a) is Tracer:
            return a.builder
    return None


def is_tracer(x):
    return isinstance(x, Tracer)


def concrete_value(x):
    """The NumPy value of x, or a clear error if x is traced."""
    if isinstance(x, Tracer):
        raise x._concrete_error("This operation")
    return np.asarray(x)
