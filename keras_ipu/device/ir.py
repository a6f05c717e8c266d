"""The graph IR: abstract values, variables, nodes and graphs.

A Graph is a flat list of Nodes in program order (like a jaxpr): each node
applies one primitive to input Vars (or Literals) with static params and
defines output Vars. `str(graph)` prints it so it reads like a jaxpr:

    { lambda ; a:f32[8,4] b:f32[4] . let
        c:f32[8,4] = add a b
      in (c) }
"""

import itertools

import math

import numpy as np

_SHORT_DTYPES = {
    "float16": "f16",
    "bfloat16": "bf16",
    "float32": "f32",
    "float64": "f64",
    "int8": "i8",
    "int16": "i16",
    "int32": "i32",
    "int64": "i64",
    "uint8": "u8",
    "uint16": "u16",
    "uint32": "u32",
    "uint64": "u64",
    "bool": "bool",
    "complex64": "c64",
    "complex128": "c128",
}


class ShapedArray:
    """An abstract value: a shape (dims may be None: unknown) and a dtype."""

    __slots__ = ("shape", "dtype")

    def __init__(self, shape, dtype):
        self.shape = tuple(None if d is None else int(d) for d in shape)
        self.dtype = np.dtype(dtype)

    @property
    def ndim(self):
        return len(self.shape)

    @property
    def size(self):
        shape = self.shape
        if None in shape:
            return None
        return math.prod(shape)

    @property
    def nbytes(self):
        size = self.size
        return None if size is None else size * self.dtype.itemsize

    def is_static(self):
        return all(d is not None for d in self.shape)

    def __eq__(self, other):
        return (
            isinstance(other, ShapedArray)
            and self.shape == other.shape
            and self.dtype == other.dtype
        )

    def __hash__(self):
        return hash((self.shape, self.dtype))

    def short(self):
        dt = _SHORT_DTYPES.get(self.dtype.name, self.dtype.name)
        dims = ",".join("?" if d is None else str(d) for d in self.shape)
        return f"{dt}[{dims}]"

    def __repr__(self):
        return f"ShapedArray({self.short()})"


def aval_of(x):
    """The abstract value of a concrete array-like (ndarray, scalar, Tensor)."""
    aval = getattr(x, "aval", None)
    if aval is not None:
        return aval
    return ShapedArray(np.shape(x), np.result_type(x))


_names = itertools.count()


class Var:
    __slots__ = ("aval", "id")

    def __init__(self, aval):
        self.aval = aval
        self.id = next(_names)

    def __repr__(self):
        return f"Var({self.id}:{self.aval.short()})"


class Literal:
    """A constant operand of a node, held by value."""

    __slots__ = ("value", "aval")

    def __init__(self, value):
        self.value = value
        self.aval = aval_of(value)

    def __repr__(self):
        v = np.asarray(self.value)
        if v.size <= 4:
            return f"{v.tolist()}:{self.aval.short()}"
        return f"const:{self.aval.short()}"


class Node:
    __slots__ = ("primitive", "inputs", "params", "outputs", "source")

    def __init__(self, primitive, inputs, params, outputs, source=None):
        self.primitive = primitive
        self.inputs = inputs
        self.params = params
        self.outputs = outputs
        # The Keras layer (or op) path that made the node, for reports.
        self.source = source


def subgraphs(node):
    """The Graphs `node` runs (cond branches, loop bodies, ...): the params
    its primitive names in `subgraph_params`, in that order."""
    params = node.params
    for name in node.primitive.subgraph_params:
        value = params[name]
        if isinstance(value, Graph):
            yield value
        else:
            yield from value


class Graph:
    def __init__(self):
        self.inputs = []
        self.nodes = []
        self.outputs = []

    def __str__(self):
        return GraphPrinter(self).render()


def _fmt_param(v):
    if isinstance(v, Graph):
        return "{...}"
    if isinstance(v, tuple) and v and all(isinstance(g, Graph) for g in v):
        return "(" + " ".join("{...}" for _ in v) + ")"
    if isinstance(v, np.dtype):
        return v.name
    if callable(v):
        return getattr(v, "__name__", "fn")
    return repr(v)


class GraphPrinter:
    def __init__(self, graph):
        self.graph = graph
        self.names = {}

    def name(self, operand):
        if isinstance(operand, Literal):
            return repr(operand)
        if operand.id not in self.names:
            n = len(self.names)
            letters = ""
            while True:
                letters = chr(ord("a") + n % 26) + letters
                n = n // 26 - 1
                if n < 0:
                    break
            self.names[operand.id] = letters
        return self.names[operand.id]

    def typed(self, var):
        return f"{self.name(var)}:{var.aval.short()}"

    def render(self):
        g = self.graph
        ins = " ".join(self.typed(v) for v in g.inputs)
        lines = [f"{{ lambda ; {ins} . let"]
        for node in g.nodes:
            outs = " ".join(self.typed(v) for v in node.outputs)
            params = ""
            if node.params:
                params = (
                    "["
                    + " ".join(
                        f"{k}={_fmt_param(v)}" for k, v in node.params.items()
                    )
                    + "]"
                )
            args = " ".join(self.name(v) for v in node.inputs)
            lines.append(f"    {outs} = {node.primitive.name}{params} {args}")
        outs = " ".join(self.name(v) for v in g.outputs)
        lines.append(f"  in ({outs}) }}")
        return "\n".join(lines)
