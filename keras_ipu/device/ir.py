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
import operator

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


# The attributes an array value answers like a NumPy array. The eager Tensor
# reads them from its ndarray and the Tracer from its ShapedArray: one list,
# so the two array types of the backend answer the same questions.
ARRAY_ATTRIBUTES = ("shape", "dtype", "ndim", "size")


def forward_array_attributes(holder):
    """Class decorator: ARRAY_ATTRIBUTES as read-only properties that read
    `self.<holder>.<name>` (attrgetter: no Python frame on these hot reads)."""

    def decorate(cls):
        for name in ARRAY_ATTRIBUTES:
            setattr(cls, name, property(operator.attrgetter(f"{holder}.{name}")))
        return cls

    return decorate


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
    __slots__ = ("primitive", "inputs", "params", "outputs", "source", "stage", "ipu")

    def __init__(self, primitive, inputs, params, outputs, source=None, stage=None,
                 ipu=None):
        self.primitive = primitive
        self.inputs = inputs
        self.params = params
        self.outputs = outputs
        # The Keras layer (or op) path that made the node, for reports.
        self.source = source
        # Where it runs, set by the placement pass (compiler/placement.py):
        # its pipeline stage and IPU. None: not placed (a one-IPU program,
        # IPU 0), or a control-flow node whose body runs on several IPUs
        # (its body's nodes carry the tags).
        self.stage = stage
        self.ipu = ipu


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


# -- placement tags (set by compiler/placement.py) ----------------------------
def runs_on(node):
    """The IPU `node` runs on: its tag; 0 for an untagged node (a one-IPU
    program); None for a control-flow node whose sub-graphs span IPUs."""
    if node.ipu is not None:
        return node.ipu
    if any(_tagged_inside(g) for g in subgraphs(node)):
        return None
    return 0


def _tagged_inside(graph):
    return any(n.ipu is not None or any(_tagged_inside(g) for g in subgraphs(n))
               for n in graph.nodes)


def ipus_of(graph):
    """The IPUs a program's nodes run on, sub-graphs included ((0,) when
    it is not placed)."""
    found = set()
    for node in graph.nodes:
        where = runs_on(node)
        if where is None:
            for sub in subgraphs(node):
                found.update(ipus_of(sub) if sub.nodes else ())
        else:
            found.add(where)
    return tuple(sorted(found)) or (0,)


def output_tag(node, k, tag="ipu"):
    """The `tag` ("ipu" or "stage") of output k of `node`: the node's own or,
    for a control-flow node spanning IPUs, that of the node making the
    output in the sub-graph returning it (the highest over a cond's
    branches); None when not placed, or when that sub-graph passes an input
    through."""
    value = getattr(node, tag)
    if value is not None:
        return value
    found = []
    for name in node.primitive.result_graphs:
        graphs = node.params[name]
        for graph in (graphs if isinstance(graphs, tuple) else (graphs,)):
            out = graph.outputs[k]
            for inner in graph.nodes:
                if out in inner.outputs:
                    held = output_tag(inner, inner.outputs.index(out), tag)
                    if held is not None:
                        found.append(held)
    return max(found) if found else None


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
