"""Small lax-style wrappers over the device primitives, for the nn ops.

The nn ops bind primitives directly (not via keras_ipu.backend.numpy) for
the common elementwise and reduction steps: operands here already share
one dtype, so no Keras promotion is needed, and scalar constants are made
in the operand's dtype so they never widen it.
"""

import numpy as np

from keras.src.backend.common import standardize_dtype

from keras_ipu.backend.core import _np_dtype
from keras_ipu.backend.core import convert_to_tensor
from keras_ipu.device.primitives import elementwise as ew
from keras_ipu.device.primitives import reduce as red
from keras_ipu.device.primitives.convert import convert_element_type_p
from keras_ipu.device.primitives.shape_rules import normalize_axes
from keras_ipu.device.primitives.structure import broadcast_to_p
from keras_ipu.device.primitives.structure import reshape_p
from keras_ipu.device.primitives.structure import transpose_p


def tensor(x, dtype=None):
    return convert_to_tensor(x, dtype)


def dtype_name(x):
    return standardize_dtype(x.dtype)


def is_float(x):
    return dtype_name(x) in ("float16", "bfloat16", "float32", "float64")


def float_tensor(x):
    """x as a tensor; integer and bool inputs become floatx (as JAX's
    activations do)."""
    from keras.src.backend import config

    x = convert_to_tensor(x)
    if not is_float(x):
        x = cast(x, config.floatx())
    return x


_WIDE = {"float32": "float64", "complex64": "complex128", "int32": "int64",
         "uint32": "uint64"}


def promote(*xs, floating=False):
    """xs converted to their Keras result dtype (floatx for integer results
    when `floating`). Keras' lattice narrows 64-bit results to 32 bits (JAX
    without x64); the host keeps 64-bit inputs 64-bit, so an explicitly
    64-bit operand widens the result back."""
    from keras.src.backend.common import dtypes

    from keras_ipu.backend.dtype_utils import dtype_of

    kinds = [dtype_of(x) for x in xs]
    dtype = dtypes.result_type(*kinds)
    if floating and dtype not in ("float16", "bfloat16", "float32", "float64",
                                  "complex64", "complex128"):
        dtype = dtypes.result_type(dtype, float)
    if any(isinstance(k, str) and k.endswith("64") for k in kinds):
        dtype = _WIDE.get(dtype, dtype)
    return [convert_to_tensor(x, dtype) for x in xs]


def cast(x, dtype):
    dtype = _np_dtype(standardize_dtype(dtype))
    if x.dtype == dtype:
        return x
    return convert_element_type_p.bind(x, dtype=dtype)


def const(value, like):
    """A scalar constant in the dtype of `like` (or of dtype `like`)."""
    dtype = like if isinstance(like, np.dtype) else like.dtype
    return np.asarray(value, dtype=dtype)


def _args(x, y):
    # One side may be a Python scalar: make it a constant of the other's dtype.
    if isinstance(x, (int, float, bool)):
        x = const(x, y)
    if isinstance(y, (int, float, bool)):
        y = const(y, x)
    return x, y


def add(x, y):
    return ew.add_p.bind(*_args(x, y))


def sub(x, y):
    return ew.sub_p.bind(*_args(x, y))


def mul(x, y):
    return ew.mul_p.bind(*_args(x, y))


def div(x, y):
    return ew.div_p.bind(*_args(x, y))


def maximum(x, y):
    return ew.max_p.bind(*_args(x, y))


def minimum(x, y):
    return ew.min_p.bind(*_args(x, y))


def pow(x, y):  # noqa: A001
    return ew.pow_p.bind(*_args(x, y))


def logaddexp(x, y):
    return ew.logaddexp_p.bind(*_args(x, y))


def gt(x, y):
    return ew.gt_p.bind(*_args(x, y))


def ge(x, y):
    return ew.ge_p.bind(*_args(x, y))


def lt(x, y):
    return ew.lt_p.bind(*_args(x, y))


def le(x, y):
    return ew.le_p.bind(*_args(x, y))


def eq(x, y):
    return ew.eq_p.bind(*_args(x, y))


def ne(x, y):
    return ew.ne_p.bind(*_args(x, y))


def logical_and(x, y):
    return ew.and_p.bind(x, y)


def select(pred, on_true, on_false):
    if isinstance(on_true, (int, float)):
        on_true = const(on_true, on_false)
    if isinstance(on_false, (int, float)):
        on_false = const(on_false, on_true)
    return ew.select_p.bind(pred, on_true, on_false)


def clip(x, lo, hi):
    return ew.clamp_p.bind(const(lo, x), x, const(hi, x))


def neg(x):
    return ew.neg_p.bind(x)


def _unary(prim):
    def fn(x):
        return prim.bind(x)

    fn.__name__ = prim.name
    return fn


exp = _unary(ew.exp_p)
expm1 = _unary(ew.expm1_p)
log = _unary(ew.log_p)
log1p = _unary(ew.log1p_p)
sqrt = _unary(ew.sqrt_p)
rsqrt = _unary(ew.rsqrt_p)
square = _unary(ew.square_p)
tanh = _unary(ew.tanh_p)
abs = _unary(ew.abs_p)  # noqa: A001
logistic = _unary(ew.logistic_p)
erf = _unary(ew.erf_p)
isfinite = _unary(ew.isfinite_p)


def _keepdims_shape(shape, axes):
    return tuple(1 if i in axes else d for i, d in enumerate(shape))


def reduce(prim, x, axis=None, keepdims=False):
    axes = normalize_axes(axis, x.ndim)
    out = prim.bind(x, axes=axes)
    if keepdims:
        out = reshape(out, _keepdims_shape(x.shape, axes))
    return out


def sum(x, axis=None, keepdims=False):  # noqa: A001
    return reduce(red.reduce_sum_p, x, axis, keepdims)


def max(x, axis=None, keepdims=False):  # noqa: A001
    return reduce(red.reduce_max_p, x, axis, keepdims)


def min(x, axis=None, keepdims=False):  # noqa: A001
    return reduce(red.reduce_min_p, x, axis, keepdims)


def ones_like(x):
    """Ones shaped like x, also when x's shape has unknown dims: (b or not
    b) is all-true whatever x holds (NaN, inf)."""
    if all(d is not None for d in x.shape):
        return broadcast_to_p.bind(const(1, x), shape=tuple(x.shape))
    b = cast(x, "bool")
    return cast(ew.or_p.bind(b, ew.logical_not_p.bind(b)), x.dtype)


def mean(x, axis=None, keepdims=False):
    axes = normalize_axes(axis, x.ndim)
    total = sum(x, axes, keepdims)
    if any(x.shape[a] is None for a in axes):
        # Unknown sizes (only while tracing): count by summing ones.
        return div(total, sum(ones_like(x), axes, keepdims))
    count = 1
    for a in axes:
        count *= x.shape[a]
    return div(total, const(count, x))


def reshape(x, shape):
    shape = tuple(shape)
    if tuple(x.shape) == shape:
        return x
    return reshape_p.bind(x, new_shape=shape)


def transpose(x, perm):
    perm = tuple(int(p) for p in perm)
    if perm == tuple(range(x.ndim)):
        return x
    return transpose_p.bind(x, permutation=perm)


def broadcast_to(x, shape):
    shape = tuple(shape)
    if tuple(x.shape) == shape:
        return x
    return broadcast_to_p.bind(x, shape=shape)


def expand_dims(x, axis):
    shape = list(x.shape)
    axis = axis if axis >= 0 else len(shape) + 1 + axis
    shape.insert(axis, 1)
    return reshape(x, shape)


def moveaxis(x, src, dst):
    perm = [i for i in range(x.ndim) if i != src % x.ndim]
    perm.insert(dst % x.ndim, src % x.ndim)
    return transpose(x, perm)


def argmax(x, axis, index_dtype="int32"):
    return red.argmax_p.bind(x, axis=axis % x.ndim,
                             index_dtype=np.dtype(index_dtype))
