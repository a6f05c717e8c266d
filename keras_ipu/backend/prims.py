"""Typed, lax-like wrappers over the device primitives, shared by the backend
modules (numpy, nn_ops, image_ops, random, linalg, math).

Operands are Tensors or Tracers (dims may be None while traced) plus static
constants (Python scalars, NumPy scalars and arrays). No Keras dtype
promotion happens here: a binary op takes the dtype of its first tensor
operand (else of its first NumPy array), constants are made in that dtype so
they never widen it, and a tensor of another dtype is converted to it.
Nothing here reads a tensor's values.
"""

import builtins

import numpy as np

from keras.src.backend.common import standardize_dtype

from keras_ipu.backend.core import convert_to_tensor
from keras_ipu.backend.dtype_utils import np_dtype  # noqa: F401 (re-exported)
from keras_ipu.device.array import Tensor
from keras_ipu.device.primitives import cumulative
from keras_ipu.device.primitives import elementwise as ew
from keras_ipu.device.primitives import indexing
from keras_ipu.device.primitives import reduce as red
from keras_ipu.device.primitives import shape_rules
from keras_ipu.device.primitives import special
from keras_ipu.device.primitives import structure
from keras_ipu.device.primitives.convert import convert_element_type_p
from keras_ipu.device.trace import Tracer

# ----------------------------------------------------------------- dtypes


def is_array(x):
    """A tensor operand (eager Tensor or Tracer), as opposed to a constant."""
    return isinstance(x, (Tensor, Tracer))


def is_traced(x):
    """True for a Tracer: a value recorded into a program being traced."""
    return isinstance(x, Tracer)


def kdtype(x):
    """The Keras dtype name of a tensor."""
    return standardize_dtype(x.dtype)


def is_float(x):
    return x.dtype.kind == "f" or x.dtype.name == "bfloat16"


def tensor(x, dtype=None):
    return convert_to_tensor(x, dtype)


def _dtype_of(dtype_or_like):
    if hasattr(dtype_or_like, "dtype") and not isinstance(
        dtype_or_like, (np.dtype, type)
    ):
        return dtype_or_like.dtype
    return np_dtype(dtype_or_like)


def scalar(value, dtype):
    """A static NumPy operand of `dtype` (a dtype name, np.dtype, or an
    operand whose dtype to take)."""
    return np.asarray(value, dtype=_dtype_of(dtype))


def const(value, dtype):
    """A constant Tensor built from static Python/NumPy values."""
    return Tensor(scalar(value, dtype))


def cast(x, dtype):
    """x in `dtype` (a Keras dtype name or np.dtype): tensors are converted
    by a primitive, constants stay static NumPy values."""
    dtype = np_dtype(dtype)
    if not is_array(x):
        return np.asarray(x, dtype=dtype)
    if x.dtype == dtype:
        return x
    return convert_element_type_p.bind(x, dtype=dtype)


def _common_dtype(*xs):
    for x in xs:
        if is_array(x):
            return x.dtype
    for x in xs:
        if isinstance(x, np.ndarray):
            return x.dtype
    raise TypeError(f"no tensor or array operand among {xs!r}")


# ------------------------------------------------------------- structure


def is_static(shape):
    return builtins.all(d is not None for d in shape)


def reshape(x, shape):
    shape = tuple(shape)
    if tuple(x.shape) == shape:
        return x
    unknown = [i for i, d in enumerate(shape) if d is None]
    if len(unknown) == 1 and -1 not in shape:
        shape = tuple(-1 if d is None else d for d in shape)
    return structure.reshape_p.bind(x, new_shape=shape)


def flatten(x):
    return reshape(x, (-1,))


def transpose(x, perm):
    perm = tuple(int(p) for p in perm)
    if perm == tuple(range(x.ndim)):
        return x
    return structure.transpose_p.bind(x, permutation=perm)


def moveaxis(x, source, dest):
    if not x.ndim:
        return x
    source, dest = source % x.ndim, dest % x.ndim
    perm = [i for i in range(x.ndim) if i != source]
    perm.insert(dest, source)
    return transpose(x, perm)


def broadcast_to(x, shape):
    shape = tuple(shape)
    if tuple(x.shape) == shape:
        return x
    return structure.broadcast_to_p.bind(x, shape=shape)


def _as_tuple(axes):
    return (axes,) if isinstance(axes, int) else tuple(axes)


def expand_dims(x, axes):
    """Insert size-1 dims at the (output) positions `axes` (int or ints)."""
    axes = _as_tuple(axes)
    axes = sorted(a % (x.ndim + len(axes)) for a in axes)
    shape = list(x.shape)
    for a in axes:
        shape.insert(a, 1)
    return reshape(x, shape)


def squeeze(x, axes):
    """Drop the (size-1) dims `axes` (int or ints)."""
    axes = {a % x.ndim for a in _as_tuple(axes)}
    return reshape(x, [d for i, d in enumerate(x.shape) if i not in axes])


def keep_dims(out, in_shape, axes):
    """Re-insert reduced axes as size 1 (keepdims=True)."""
    return reshape(out, [1 if i in axes else d for i, d in enumerate(in_shape)])


def slice_axis(x, axis, start=None, stop=None, step=1):
    axis = axis % x.ndim
    starts = [None] * x.ndim
    stops = [None] * x.ndim
    steps = [1] * x.ndim
    starts[axis], stops[axis], steps[axis] = start, stop, step
    return indexing.slice_p.bind(
        x,
        start_indices=tuple(starts),
        limit_indices=tuple(stops),
        strides=tuple(steps),
    )


def concatenate(xs, axis):
    xs = list(xs)
    if len(xs) == 1:
        return xs[0]
    return structure.concatenate_p.bind(*xs, axis=axis % xs[0].ndim)


def stack(xs, axis):
    return concatenate([expand_dims(x, axis) for x in xs], axis)


def rev(x, axes):
    return structure.rev_p.bind(x, axes=tuple(axes))


def axes_of(axis, ndim):
    """Normalised, sorted tuple of axes (None: all); a user's bad axis is a
    ValueError naming it."""
    if isinstance(axis, list):
        axis = tuple(axis)
    if axis is not None and not isinstance(axis, tuple):
        axis = (int(axis),)
    if axis is not None and ndim == 0:
        for a in axis:
            if a not in (0, -1):
                raise ValueError(
                    f"axis {a} is out of bounds for a 0-d tensor; use axis=None"
                )
        return ()
    try:
        return shape_rules.normalize_axes(axis, ndim)
    except shape_rules.ShapeError as e:
        raise ValueError(f"{e}. Received: axis={axis}") from None


def axis_of(axis, ndim):
    try:
        return shape_rules.normalize_axis(int(axis), ndim)
    except shape_rules.ShapeError as e:
        raise ValueError(f"{e}. Received: axis={axis}") from None


# ------------------------------------------------------------ arithmetic


def binary(prim, a, b):
    dtype = _common_dtype(a, b)
    return prim.bind(cast(a, dtype), cast(b, dtype))


def add(a, b):
    return binary(ew.add_p, a, b)


def sub(a, b):
    return binary(ew.sub_p, a, b)


def mul(a, b):
    return binary(ew.mul_p, a, b)


def div(a, b):
    return binary(ew.div_p, a, b)


def mod(a, b):
    return binary(ew.mod_p, a, b)


def pow(a, b):  # noqa: A001
    return binary(ew.pow_p, a, b)


def maximum(a, b):
    return binary(ew.max_p, a, b)


def minimum(a, b):
    return binary(ew.min_p, a, b)


def logaddexp(a, b):
    return binary(ew.logaddexp_p, a, b)


def eq(a, b):
    return binary(ew.eq_p, a, b)


def ne(a, b):
    return binary(ew.ne_p, a, b)


def lt(a, b):
    return binary(ew.lt_p, a, b)


def le(a, b):
    return binary(ew.le_p, a, b)


def gt(a, b):
    return binary(ew.gt_p, a, b)


def ge(a, b):
    return binary(ew.ge_p, a, b)


def compare(prim, a, b):
    return binary(prim, a, b)


def logical_and(a, b):
    return binary(ew.and_p, a, b)


def logical_or(a, b):
    return binary(ew.or_p, a, b)


def logical_not(a):
    return ew.logical_not_p.bind(a)


def select(pred, on_true, on_false):
    dtype = _common_dtype(on_true, on_false)
    return ew.select_p.bind(pred, cast(on_true, dtype), cast(on_false, dtype))


where = select


def clip(x, lo, hi):
    """x clamped to [lo, hi] (bounds: constants or tensors), as lax.clamp."""
    return ew.clamp_p.bind(cast(lo, x.dtype), x, cast(hi, x.dtype))


def _unary(prim):
    def fn(x):
        return prim.bind(x)

    fn.__name__ = prim.name
    return fn


neg = _unary(ew.neg_p)
exp = _unary(ew.exp_p)
expm1 = _unary(ew.expm1_p)
log = _unary(ew.log_p)
log1p = _unary(ew.log1p_p)
sqrt = _unary(ew.sqrt_p)
rsqrt = _unary(ew.rsqrt_p)
square = _unary(ew.square_p)
tanh = _unary(ew.tanh_p)
absolute = _unary(ew.abs_p)
logistic = _unary(ew.logistic_p)
erf = _unary(special.erf_p)
isfinite = _unary(ew.isfinite_p)


def isnan(x):
    if not (is_float(x) or x.dtype.kind == "c"):
        return zeros_like(x, "bool")
    return ew.isnan_p.bind(x)


def conj(x):
    return ew.conj_p.bind(x) if x.dtype.kind == "c" else x


def square_abs(x):
    """|x|^2, real for complex x."""
    if x.dtype.kind == "c":
        r = ew.real_p.bind(x)
        i = ew.imag_p.bind(x)
        return add(mul(r, r), mul(i, i))
    return mul(x, x)


# ------------------------------------------------ filled and ramp tensors


def zeros_like(x, dtype=None):
    """Zeros of x's shape. While traced with unknown dims the shape exists
    only through x, so the zeros are derived from x (NaN-safe: via bool)."""
    dtype = x.dtype if dtype is None else np_dtype(dtype)
    if is_static(x.shape):
        return broadcast_to(const(0, dtype), x.shape)
    return cast(logical_and(cast(x, "bool"), False), dtype)


def ones_like(x, dtype=None):
    dtype = x.dtype if dtype is None else np_dtype(dtype)
    if is_static(x.shape):
        return broadcast_to(const(1, dtype), x.shape)
    return cast(logical_or(cast(x, "bool"), True), dtype)


def broadcast_like(v, x):
    """v broadcast to x's shape (v's shape must broadcast to it)."""
    if is_static(x.shape) or type(v) is not Tensor:
        return broadcast_to(v, x.shape)
    return add(v, zeros_like(x, v.dtype))


def iota(n, dtype="int32"):
    """0, 1, ..., n-1 for a static n."""
    return const(np.arange(n), dtype)


def iota_like(x, dimension, dtype="int32"):
    """0, 1, 2, ... along `dimension`, broadcastable to x's shape (a
    running count of ones when that dim is unknown while traced)."""
    dtype = np_dtype(dtype)
    n = x.shape[dimension]
    if n is not None:
        ramp = np.arange(n).reshape(
            [n if i == dimension % x.ndim else 1 for i in range(x.ndim)]
        )
        return const(ramp, dtype)
    counts = cumulative.cumsum_p.bind(ones_like(x, dtype), axis=dimension)
    return sub(counts, const(1, dtype))


# ------------------------------------------------------------ reductions


def reduce(prim, x, axis=None, keepdims=False):
    axes = shape_rules.normalize_axes(axis, x.ndim)
    if not axes:
        return x
    out = prim.bind(x, axes=axes)
    return keep_dims(out, x.shape, axes) if keepdims else out


def reduce_sum(x, axis=None, keepdims=False):
    return reduce(red.reduce_sum_p, x, axis, keepdims)


def reduce_max(x, axis=None, keepdims=False):
    return reduce(red.reduce_max_p, x, axis, keepdims)


def reduce_min(x, axis=None, keepdims=False):
    return reduce(red.reduce_min_p, x, axis, keepdims)


def count(x, axis, dtype, keepdims=False):
    """The number of elements of x reduced over `axis`, as a tensor: a
    scalar constant, or (a dim unknown while traced) a sum of ones."""
    axes = shape_rules.normalize_axes(axis, x.ndim)
    n = shape_rules.mul_dims([x.shape[a] for a in axes])
    if n is not None:
        return const(n, dtype)
    return reduce_sum(ones_like(x, dtype), axes, keepdims)


def mean(x, axis=None, keepdims=False):
    axes = shape_rules.normalize_axes(axis, x.ndim)
    return div(reduce_sum(x, axes, keepdims), count(x, axes, x.dtype, keepdims))


def argmax(x, axis, index_dtype="int32"):
    return red.argmax_p.bind(
        x, axis=axis % x.ndim, index_dtype=np.dtype(index_dtype)
    )


# The wrappers above, for the area modules that re-export them.
__all__ = [
    name
    for name, value in list(globals().items())
    if callable(value)
    and not name.startswith("_")
    and getattr(value, "__module__", None) == __name__
] + ["np_dtype"]
