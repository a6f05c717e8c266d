"""Patterns of primitives emitted as TensorFlow's own fused kernels, in the
graph mode: `overrides(graph)` gives {node: emit(read)} for the nodes the
emitter emits another way (emit gets the emitter's reader of values and
returns the node's result as a TensorFlow tensor). The nodes the new
emissions no longer read are left to TensorFlow, which prunes what no
output needs. XLA fuses these chains itself: the XLA mode emits them as
they are.

Softmax. The backend writes softmax over the last axis as primitives
(backend/nn_ops/normalization.py):

    e = exp(x - stop_gradient(max(x)));  s = sum(e);  y = e / s

and the autodiff differentiates the division and the exponential:

    dx = (g * reciprocal(s) + broadcast(sum(g * -(y / s)))) * e

which is y * (g - sum(g * y)). TensorFlow's graph runtime runs each of
these as a kernel over the full-size array (attention's scores, 2M
elements per step in the benchmark transformer): five forward and four
backward passes where Keras' TensorFlow backend runs one Softmax and
three (Mul, Sub, Mul). Both patterns found, the nodes of y and dx are
emitted as `tf.nn.softmax(x)` and `(g - reduce_sum(g * y)) * y`: within
float rounding of the primitives' values, not to the bit (another order
of operations).

Slices that tile a value along one axis (an LSTM's gates) are one
Split (the same values).

The gradients of the logistic and tanh, as the autodiff writes them
(`g * (y * (1 - y))`, `g * (1 - y * y)`, y the saved result: three
kernels each), are TensorFlow's SigmoidGrad and TanhGrad (one kernel,
the same formulas in the same order for any y: NumPy's bits): five per
step of an LSTM's backward loop, 32 steps in the benchmark's.

The gradient of a ReLU, max(x, 0), as the autodiff writes it (ties
share the cotangent, primitives/grads/elementwise.py):

    g * select(x > 0, 1, select(x == 0, 0.5, 0))

five kernels over the activations (Greater, Equal, two SelectV2 with
broadcast scalars, Mul: 7.4 ms of CPU per step on the CNN benchmark's
first layer, 4M elements), where Keras' TensorFlow backend runs one
ReluGrad (which gives a tie nothing). TensorFlow has no kernel with the
tie's half; two float32 kernels give the same bits for every x and g:
LeakyReluGrad with alpha 0.5 (g where x > 0, else g * 0.5), then
FakeQuantWithMinMaxArgsGradient over [0, FLT_MAX] with 16 bits (its
input where x >= 0, else its input * 0: the zero's sign and NaN of
g * 0). With 16 bits that range's upper end, nudged to the quantization
grid, rounds to +inf, so x = +inf keeps its cotangent too (the tests
hold it). 2.6 ms for that layer.

A sum whose operand is negated for it alone (the mean's gradient in a
batch normalization: -sum(v) over the activations, written as
sum(neg(v))) is the negated sum: one pass over the activations fewer,
the same bits (negation is exact and commutes with the sum's rounding).
"""

import numpy as np
import tensorflow as tf

from keras_ipu.device.compiler.graph_utils import is_literal_of
from keras_ipu.device import liveness
from keras_ipu.device.ir import Literal

_FLOATS = {np.dtype(np.float32), np.dtype(np.float64)}


class _Makers:
    """Who makes each value of a graph (its own nodes)."""

    def __init__(self, graph):
        self.nodes = graph.nodes
        self.live = liveness.analyze(graph)
        self.made_at = self.live.made_at

    def node(self, v, *names):
        """The node making `v` when it is one of primitives `names`."""
        if type(v) is Literal:
            return None
        at = self.made_at.get(v)
        node = None if at is None else self.nodes[at]
        if node is None or node.primitive.name not in names:
            return None
        return node

    def under_reshapes(self, v):
        """`v` with the reshapes (and broadcasts) that made it looked
        through: a reduction kept as keepdims is a reshape of it."""
        while True:
            node = self.node(v, "reshape", "broadcast_to")
            if node is None:
                return v
            v = node.inputs[0]

    def last_axis_reduction(self, v, name, of):
        """Whether `v` is reduce `name` of `of` over its last axis (seen
        through reshapes)."""
        node = self.node(self.under_reshapes(v), name)
        return (node is not None and node.inputs[0] is of
                and tuple(node.params["axes"]) == (of.aval.ndim - 1,))


def _operands(node, test):
    """(a, b) of the binary `node` with test(a) true, either order; None."""
    a, b = node.inputs
    if test(a):
        return a, b
    if test(b):
        return b, a
    return None


def _kept_sum_shape(x, s):
    shape = tuple(x.aval.shape)
    return tuple(s.aval.shape) == shape[:-1] + (1,)


def overrides(graph):
    """{node: emit(read)} for the nodes of `graph` (its own, not its
    sub-graphs') that match a pattern."""
    makers = _Makers(graph)
    found = _splits(graph)
    found.update(_activation_gradients(graph, makers))
    found.update(_softmaxes(graph, makers))
    found.update(_relu_gradients(graph, makers))
    found.update(_negated_sums(graph, makers))
    return found


def _splits(graph):
    """Slices of one value that tile it along one axis (an LSTM's four
    gates, every step of its forward loop) as one Split: one kernel
    where each slice was one StridedSlice."""
    by_operand = {}
    for node in graph.nodes:
        if node.primitive.name == "slice" and type(node.inputs[0]) is not Literal:
            by_operand.setdefault(node.inputs[0], []).append(node)
    found = {}
    for x, slices in by_operand.items():
        shape = tuple(x.aval.shape)
        if len(slices) < 2 or None in shape:
            continue
        spans, axes = [], set()
        for node in slices:
            ranges = [slice(a, b, st).indices(n) for n, a, b, st in zip(
                shape, node.params["start_indices"], node.params["limit_indices"],
                node.params["strides"])]
            cut = [d for d, (lo, hi, st) in enumerate(ranges) if (lo, hi, st) != (0, shape[d], 1)]
            if len(cut) != 1 or ranges[cut[0]][2] != 1:
                break
            axes.add(cut[0])
            lo, hi, _ = ranges[cut[0]]
            spans.append((lo, hi, node))
        else:
            spans.sort(key=lambda span: span[0])
            ends = [0] + [hi for _, hi, _ in spans]
            if (len(axes) != 1 or ends[-1] != shape[next(iter(axes))]
                    or any(lo != end or hi <= lo for (lo, hi, _), end in zip(spans, ends))):
                continue
            axis = axes.pop()
            parts = {}

            def part(read, k, x=x, sizes=[hi - lo for lo, hi, _ in spans], axis=axis,
                     parts=parts):
                if not parts:
                    parts.update(enumerate(tf.split(read(x), sizes, axis=axis)))
                return parts[k]

            for k, (_, _, node) in enumerate(spans):
                found[node] = lambda read, k=k, part=part: part(read, k)
    return found


def _activation_gradients(graph, makers):
    """g * (y * (1 - y)) as SigmoidGrad(y, g); g * (1 - y * y) as
    TanhGrad(y, g); either order of each product."""
    found = {}
    for node, g, d, shape in _cotangent_products(graph, _FLOATS):
        if node in found:
            continue
        y = _sigmoid_derivative_of(makers, d)
        if y is not None and tuple(y.aval.shape) == shape:
            found[node] = lambda read, y=y, g=g: tf.raw_ops.SigmoidGrad(y=read(y), dy=read(g))
            continue
        y = _tanh_derivative_of(makers, d)
        if y is not None and tuple(y.aval.shape) == shape:
            found[node] = lambda read, y=y, g=g: tf.raw_ops.TanhGrad(y=read(y), dy=read(g))
    return found


def _cotangent_products(graph, dtypes):
    """(node, g, d, shape) for each product of `dtypes` and each order of
    its operands where `g` is an array of the product's `shape`: where the
    autodiff multiplies a cotangent g by an activation's derivative d
    (their patterns take the first order that matches)."""
    for node in graph.nodes:
        if node.primitive.name != "mul" or np.dtype(node.outputs[0].aval.dtype) not in dtypes:
            continue
        shape = tuple(node.outputs[0].aval.shape)
        for g, d in (node.inputs, reversed(node.inputs)):
            if type(g) is not Literal and tuple(g.aval.shape) == shape:
                yield node, g, d, shape


def _one_minus(makers, v):
    """x when v is 1 - x, else None."""
    sub = makers.node(v, "sub")
    if sub is None or not is_literal_of(sub.inputs[0], 1) or type(sub.inputs[1]) is Literal:
        return None
    return sub.inputs[1]


def _sigmoid_derivative_of(makers, d):
    """y when d is y * (1 - y), either order."""
    mul = makers.node(d, "mul")
    if mul is None:
        return None
    for y, rest in (mul.inputs, reversed(mul.inputs)):
        if type(y) is not Literal and _one_minus(makers, rest) is y:
            return y
    return None


def _tanh_derivative_of(makers, d):
    """y when d is 1 - y * y."""
    square = makers.node(_one_minus(makers, d), "mul")
    if square is None or square.inputs[0] is not square.inputs[1]:
        return None
    return square.inputs[0]


def _softmaxes(graph, makers):
    """The softmax and softmax-gradient nodes (the module's doc)."""
    overrides = {}
    found = {}  # e -> (y, s)
    for node in graph.nodes:
        if node.primitive.name != "div":
            continue
        e, s = node.inputs
        y = node.outputs[0]
        exp = makers.node(e, "exp")
        sub = exp and makers.node(exp.inputs[0], "sub")
        if sub is None:
            continue
        x, shift = sub.inputs
        stop = makers.node(shift, "stop_gradient")
        if (type(x) is Literal or stop is None
                or np.dtype(x.aval.dtype) not in _FLOATS or None in x.aval.shape
                or x.aval.ndim == 0 or tuple(y.aval.shape) != tuple(x.aval.shape)
                or not _kept_sum_shape(x, s) or not _kept_sum_shape(x, shift)
                or not makers.last_axis_reduction(stop.inputs[0], "reduce_max", x)
                or not makers.last_axis_reduction(s, "reduce_sum", e)):
            continue
        overrides[node] = lambda read, x=x: tf.nn.softmax(read(x), axis=-1)
        found[e] = (y, s)

    for node in graph.nodes:
        if node.primitive.name != "mul" or not found:
            continue
        pair = _operands(node, lambda v: v in found)
        if pair is None:
            continue
        e, total = pair
        y, s = found[e]
        add = makers.node(total, "add")
        if add is None:
            continue
        g = _direct_term(makers, add, y, s)
        if g is None:
            continue
        overrides[node] = lambda read, g=g, y=y: _softmax_gradient(read(g), read(y))
    return overrides


def _direct_term(makers, add, y, s):
    """g when `add` is g * reciprocal(s) + broadcast(sum(g * -(y / s)))
    (either order of each pair), else None."""

    def is_reciprocal_of_s(u):
        r = makers.node(u, "reciprocal")
        return r is not None and r.inputs[0] is s

    def scaled(v):  # g * reciprocal(s) -> g
        mul = makers.node(v, "mul")
        pair = mul and _operands(mul, is_reciprocal_of_s)
        return pair[1] if pair else None

    for direct, spread in (add.inputs, reversed(add.inputs)):
        g = scaled(direct)
        if g is None or makers.node(spread, "broadcast_to", "reshape") is None:
            continue
        total = makers.node(makers.under_reshapes(spread), "reduce_sum")
        if total is None or tuple(total.params["axes"]) != (total.inputs[0].aval.ndim - 1,):
            continue
        mul = makers.node(total.inputs[0], "mul")
        pair = mul and _operands(mul, lambda u: u is g)
        if pair is None:
            continue
        neg = makers.node(pair[1], "neg")
        div = neg and makers.node(neg.inputs[0], "div")
        if div is not None and div.inputs[0] is y and div.inputs[1] is s:
            return g
    return None


def _softmax_gradient(g, y):
    """TensorFlow's own gradient of Softmax (nn_grad._SoftmaxGrad)."""
    return (g - tf.reduce_sum(g * y, axis=-1, keepdims=True)) * y


def _relu_gradients(graph, makers):
    """g * relu'(x) with the tie's half (the module's doc) as
    LeakyReluGrad then FakeQuantWithMinMaxArgsGradient; float32 only (the
    second kernel's one dtype)."""
    found = {}
    for node, g, share, shape in _cotangent_products(graph, {np.dtype(np.float32)}):
        if node in found:
            continue
        x = _relu_derivative_of(makers, share)
        if x is not None and tuple(x.aval.shape) == shape:
            found[node] = lambda read, x=x, g=g: _relu_gradient(read(g), read(x))
    return found


def _relu_derivative_of(makers, share):
    """x when `share` is select(x > 0, 1, select(x == 0, 0.5, 0)). Not
    max(0, x)'s share of x: that one gives a NaN x all of g."""
    outer = makers.node(share, "select")
    if outer is None:
        return None
    which, wins, rest = outer.inputs
    inner = makers.node(rest, "select")
    strict = makers.node(which, "gt")
    if inner is None or strict is None:
        return None
    tie, half, loses = inner.inputs
    equal = makers.node(tie, "eq")
    x, zero = strict.inputs
    if (equal is None or type(x) is Literal or np.dtype(x.aval.dtype) != np.float32
            or not is_literal_of(zero, 0) or equal.inputs[0] is not x
            or not is_literal_of(equal.inputs[1], 0)):
        return None
    if is_literal_of(wins, 1) and is_literal_of(half, 0.5) and is_literal_of(loses, 0):
        return x
    return None


_FLOAT32_MAX = float(np.finfo(np.float32).max)


def _relu_gradient(g, x):
    half_below = tf.raw_ops.LeakyReluGrad(gradients=g, features=x, alpha=0.5)
    return tf.raw_ops.FakeQuantWithMinMaxArgsGradient(
        gradients=half_below, inputs=x, min=0.0, max=_FLOAT32_MAX, num_bits=16)


def _negated_sums(graph, makers):
    """reduce_sum(neg(v)) as -reduce_sum(v) where the neg's one reader is
    that sum (the module's doc); floats (a bool has no neg)."""
    # Here, not at the top: the emitter imports this module before its
    # rule table is filled.
    from keras_ipu.device.to_tensorflow.emitter import MODE_RULES
    from keras_ipu.device.to_tensorflow.emitter import RuleContext

    found = {}
    for node in graph.nodes:
        if node.primitive.name != "reduce_sum":
            continue
        neg = makers.node(node.inputs[0], "neg")
        if (neg is None or np.dtype(neg.outputs[0].aval.dtype) not in _FLOATS
                or type(neg.inputs[0]) is Literal
                or not makers.live.read_once(neg.outputs[0])):
            continue

        def negated(read, node=node, v=neg.inputs[0]):
            total = MODE_RULES["graph"]["reduce_sum"](
                RuleContext(node, "graph"), read(v), **node.params)
            return tf.negative(total)

        found[node] = negated
    return found
