"""Small builders on device primitives, shared by the reduction, statistics,
sorting and linear-algebra modules of keras.ops.numpy.

They take Tensors or Tracers (shapes may hold None while traced) and only
bind primitives; nothing here reads a tensor's values.
"""

import builtins

import numpy as np

from keras.src.backend.common import standardize_dtype

from keras_ipu.backend.core import _np_dtype
from keras_ipu.backend.core import convert_to_tensor
from keras_ipu.device.array import Tensor
from keras_ipu.device.primitives import cumulative
from keras_ipu.device.primitives import elementwise as ew
from keras_ipu.device.primitives import indexing
from keras_ipu.device.primitives import reduce as red
from keras_ipu.device.primitives import shape_rules
from keras_ipu.device.primitives import structure
from keras_ipu.device.primitives.convert import convert_element_type_p


def np_dtype(dtype):
    """A Keras dtype name (or NumPy dtype) as a NumPy dtype."""
    if isinstance(dtype, np.dtype):
        return dtype
    return _np_dtype(standardize_dtype(dtype))


def kdtype(x):
    """The Keras dtype name of a tensor."""
    return standardize_dtype(x.dtype)


def tensor(x, dtype=None):
    return convert_to_tensor(x, dtype)


def const(value, dtype):
    """A constant built from static Python/NumPy values."""
    return Tensor(np.asarray(value, dtype=np_dtype(dtype)))


def cast(x, dtype):
    dtype = np_dtype(dtype)
    if x.dtype == dtype:
        return x
    return convert_element_type_p.bind(x, dtype=dtype)


def is_float(x):
    return x.dtype.kind == "f" or x.dtype.name == "bfloat16"


def axes_of(axis, ndim):
    """Normalised, sorted tuple of axes (None: all)."""
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


# ------------------------------------------------------------- structure


def reshape(x, shape):
    shape = tuple(shape)
    if tuple(x.shape) == shape:
        return x
    unknown = [i for i, d in enumerate(shape) if d is None]
    if len(unknown) == 1 and -1 not in shape:
        shape = tuple(-1 if d is None else d for d in shape)
    return structure.reshape_p.bind(x, new_shape=shape)


def transpose(x, perm):
    perm = tuple(perm)
    if perm == tuple(range(x.ndim)):
        return x
    return structure.transpose_p.bind(x, permutation=perm)


def moveaxis(x, source, dest):
    perm = [i for i in range(x.ndim) if i != source]
    perm.insert(dest % x.ndim if x.ndim else 0, source)
    return transpose(x, perm)


def broadcast_to(x, shape):
    shape = tuple(shape)
    if tuple(x.shape) == shape:
        return x
    return structure.broadcast_to_p.bind(x, shape=shape)


def expand_dims(x, axes):
    """Insert size-1 dims at the (output) positions `axes`."""
    axes = sorted(a % (x.ndim + len(axes)) for a in axes)
    shape = list(x.shape)
    for a in axes:
        shape.insert(a, 1)
    return reshape(x, shape)


def squeeze(x, axes):
    return reshape(x, [d for i, d in enumerate(x.shape) if i not in axes])


def keep_dims(out, in_shape, axes):
    """Re-insert reduced axes as size 1 (keepdims=True)."""
    return reshape(
        out, [1 if i in axes else d for i, d in enumerate(in_shape)]
    )


def flatten(x):
    return reshape(x, (-1,))


def slice_axis(x, axis, start=None, stop=None, step=1):
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
    if len(xs) == 1:
        return xs[0]
    return structure.concatenate_p.bind(*xs, axis=axis)


def rev(x, axes):
    return structure.rev_p.bind(x, axes=tuple(axes))


def is_static(shape):
    return builtins.all(d is not None for d in shape)


def zeros_like(x, dtype):
    """Zeros of x's shape. While traced with unknown dims the shape exists
    only through x, so the zeros are derived from x (NaN-safe: via bool)."""
    dtype = np_dtype(dtype)
    if is_static(x.shape):
        return broadcast_to(const(0, dtype), x.shape)
    falsy = logical_and(cast(x, "bool"), const(False, "bool"))
    return cast(falsy, dtype)


def ones_like(x, dtype):
    dtype = np_dtype(dtype)
    if is_static(x.shape):
        return broadcast_to(const(1, dtype), x.shape)
    truthy = logical_or(cast(x, "bool"), const(True, "bool"))
    return cast(truthy, dtype)


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


# ------------------------------------------------------------ arithmetic


def _same(a, b):
    """Bring a constant operand to the tensor operand's dtype."""
    if not hasattr(a, "dtype") or isinstance(a, np.ndarray):
        a = const(a, b.dtype) if hasattr(b, "dtype") else a
    if not hasattr(b, "dtype") or isinstance(b, np.ndarray):
        b = const(b, a.dtype)
    return a, b


def binary(prim, a, b):
    a, b = _same(a, b)
    return prim.bind(a, b)


def add(a, b):
    return binary(ew.add_p, a, b)


def sub(a, b):
    return binary(ew.sub_p, a, b)


def mul(a, b):
    return binary(ew.mul_p, a, b)


def div(a, b):
    return binary(ew.div_p, a, b)


def neg(a):
    return ew.neg_p.bind(a)


def maximum(a, b):
    return binary(ew.max_p, a, b)


def minimum(a, b):
    return binary(ew.min_p, a, b)


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


def logical_and(a, b):
    return binary(ew.and_p, a, b)


def logical_or(a, b):
    return binary(ew.or_p, a, b)


def logical_not(a):
    return ew.logical_not_p.bind(a)


def where(pred, on_true, on_false):
    if not hasattr(on_true, "dtype") or isinstance(on_true, (int, float)):
        on_true = const(on_true, on_false.dtype)
    if not hasattr(on_false, "dtype") or isinstance(on_false, (int, float)):
        on_false = const(on_false, on_true.dtype)
    return ew.select_p.bind(pred, on_true, on_false)


def isnan(x):
    if not (is_float(x) or x.dtype.kind == "c"):
        return zeros_like(x, "bool")
    return ew.isnan_p.bind(x)


def sqrt(x):
    return ew.sqrt_p.bind(x)


def conj(x):
    return ew.conj_p.bind(x) if x.dtype.kind == "c" else x


def abs_(x):
    return ew.abs_p.bind(x)


def square_abs(x):
    """|x|^2, real for complex x."""
    if x.dtype.kind == "c":
        r = ew.real_p.bind(x)
        i = ew.imag_p.bind(x)
        return add(mul(r, r), mul(i, i))
    return mul(x, x)


# ------------------------------------------------------------ reductions


def reduce(prim, x, axes, keepdims=False):
    axes = tuple(axes)
    if not axes:
        return x
    out = prim.bind(x, axes=axes)
    return keep_dims(out, x.shape, axes) if keepdims else out


def rsum(x, axes, keepdims=False):
    return reduce(red.reduce_sum_p, x, axes, keepdims)


def count(x, axes, dtype, keepdims=False):
    """The number of elements of x reduced over `axes`, as a tensor: a
    scalar constant, or (a dim unknown while traced) a sum of ones."""
    n = shape_rules.mul_dims([x.shape[a] for a in axes])
    if n is not None:
        return const(n, dtype)
    return rsum(ones_like(x, dtype), axes, keepdims)
