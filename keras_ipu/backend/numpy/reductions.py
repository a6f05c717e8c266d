"""Reductions of keras.ops.numpy: sum, prod, max, argmax, the nan-variants,
cumulative sums and products, diff and trace.

Statistics (mean-like, quantiles, histograms) live in statistics.py and
sorting in sorting.py; both are re-exported here, so `keras.ops.numpy`
finds every op of this family through this module.
"""

import builtins

import numpy as np

from keras.src.backend.common import dtypes

from keras_ipu.backend import prims as b
from keras_ipu.device.primitives import cumulative
from keras_ipu.device.primitives import elementwise as ew
from keras_ipu.device.primitives import reduce as red
from keras_ipu.device.primitives import structure

__all__ = [
    "sum",
    "prod",
    "max",
    "min",
    "amax",
    "amin",
    "all",
    "any",
    "argmax",
    "argmin",
    "nanmax",
    "nanmin",
    "nanprod",
    "nansum",
    "nanargmax",
    "nanargmin",
    "ptp",
    "count_nonzero",
    "cumsum",
    "cumprod",
    "nancumsum",
    "nancumprod",
    "diff",
    "trace",
]

_WIDEN = {
    "bool": "int32",
    "int8": "int32",
    "int16": "int32",
    "uint8": "uint32",
    "uint16": "uint32",
}


def _accumulator_dtype(dtype):
    """Sums and products of small integers widen to 32 bits (as JAX)."""
    return _WIDEN.get(dtype, dtype)


def _prepare(x, axis):
    x = b.tensor(x)
    return x, b.axes_of(axis, x.ndim)


def sum(x, axis=None, keepdims=False):
    x, axes = _prepare(x, axis)
    # Keras' symbolic rule: result_type (which demotes 64-bit), widened.
    x = b.cast(x, _accumulator_dtype(dtypes.result_type(b.kdtype(x))))
    return b.reduce(red.reduce_sum_p, x, axes, keepdims)


def prod(x, axis=None, keepdims=False, dtype=None):
    x, axes = _prepare(x, axis)
    if dtype is None:
        dtype = _accumulator_dtype(b.kdtype(x))
    x = b.cast(x, dtype)
    return b.reduce(red.reduce_prod_p, x, axes, keepdims)


def _extreme(prim, combine, x, axis, keepdims, initial):
    x, axes = _prepare(x, axis)
    if initial is None:
        _check_not_empty(x, axes, prim.name)
    elif not axes:
        return combine(x, b.const(initial, x.dtype))
    else:
        # `initial` joins the reduced values, so empty axes reduce to it:
        # pad every reduced axis by one slot of it.
        config = tuple((1 if i in axes else 0, 0, 0) for i in range(x.ndim))
        x = structure.pad_p.bind(x, b.const(initial, x.dtype), config=config)
    return b.reduce(prim, x, axes, keepdims)


def _check_not_empty(x, axes, name):
    if builtins.any(x.shape[a] == 0 for a in axes) or (not axes and 0 in x.shape):
        raise ValueError(
            f"Cannot compute the {name.replace('reduce_', '')} of an empty "
            f"tensor (shape {x.shape}) over axes {axes}: the reduction has no "
            "identity. Pass `initial=` or reduce over non-empty axes."
        )


def max(x, axis=None, keepdims=False, initial=None):
    return _extreme(red.reduce_max_p, b.maximum, x, axis, keepdims, initial)


def min(x, axis=None, keepdims=False, initial=None):
    return _extreme(red.reduce_min_p, b.minimum, x, axis, keepdims, initial)


def amax(x, axis=None, keepdims=False):
    return max(x, axis=axis, keepdims=keepdims)


def amin(x, axis=None, keepdims=False):
    return min(x, axis=axis, keepdims=keepdims)


def all(x, axis=None, keepdims=False):
    x, axes = _prepare(x, axis)
    return b.reduce(red.reduce_and_p, b.cast(x, "bool"), axes, keepdims)


def any(x, axis=None, keepdims=False):
    x, axes = _prepare(x, axis)
    return b.reduce(red.reduce_or_p, b.cast(x, "bool"), axes, keepdims)


def _arg_extreme(prim, x, axis, keepdims):
    x = b.tensor(x)
    if x.ndim == 0:
        return b.const(0, "int32")
    if b.is_float(x):
        # -0.0 ranks below +0.0, as Keras' other backends order them.
        dtype = dtypes.result_type(b.kdtype(x), "float32")
        x = b.cast(x, dtype)
        negative_zero = b.logical_and(b.eq(x, 0.0), ew.signbit_p.bind(x))
        x = b.where(negative_zero, -np.finfo(b.np_dtype(dtype)).tiny, x)
    in_shape = x.shape
    if axis is None:
        flat = b.flatten(x)
        out = prim.bind(flat, axis=0, index_dtype=np.dtype(np.int32))
        if keepdims:
            out = b.reshape(out, [1] * len(in_shape))
        return out
    axis = b.axis_of(axis, x.ndim)
    out = prim.bind(x, axis=axis, index_dtype=np.dtype(np.int32))
    return b.keep_dims(out, in_shape, (axis,)) if keepdims else out


def argmax(x, axis=None, keepdims=False):
    return _arg_extreme(red.argmax_p, x, axis, keepdims)


def argmin(x, axis=None, keepdims=False):
    return _arg_extreme(red.argmin_p, x, axis, keepdims)


# ----------------------------------------------------------- nan-variants


def _replace_nan(x, value):
    """x (converted to a tensor) with its NaNs replaced by `value`: the
    identity of the reduction a nan-variant then runs."""
    x = b.tensor(x)
    if not (b.is_float(x) or x.dtype.kind == "c"):
        return x
    return b.where(b.isnan(x), b.const(value, x.dtype), x)


def nansum(x, axis=None, keepdims=False):
    return sum(_replace_nan(x, 0), axis=axis, keepdims=keepdims)


def nanprod(x, axis=None, keepdims=False):
    return prod(_replace_nan(x, 1), axis=axis, keepdims=keepdims)


def _nan_extreme(fn, fill, x, axis, keepdims):
    x = b.tensor(x)
    x = b.cast(x, dtypes.result_type(b.kdtype(x)))
    if not b.is_float(x):
        return fn(x, axis=axis, keepdims=keepdims)
    nan = b.isnan(x)
    out = fn(_replace_nan(x, fill), axis=axis, keepdims=keepdims)
    all_nan = all(nan, axis=axis, keepdims=keepdims)
    return b.where(all_nan, b.const(np.nan, x.dtype), out)


def nanmax(x, axis=None, keepdims=False):
    return _nan_extreme(max, -np.inf, x, axis, keepdims)


def nanmin(x, axis=None, keepdims=False):
    return _nan_extreme(min, np.inf, x, axis, keepdims)


def _nan_arg_extreme(fn, fill, x, axis, keepdims):
    x = b.tensor(x)
    if not b.is_float(x):
        return fn(x, axis=axis, keepdims=keepdims)
    nan = b.isnan(x)
    out = fn(_replace_nan(x, fill), axis=axis, keepdims=keepdims)
    # An all-NaN slice has no answer: -1, as Keras' other backends give.
    all_nan = all(nan, axis=axis, keepdims=keepdims)
    return b.where(all_nan, b.const(-1, "int32"), out)


def nanargmax(x, axis=None, keepdims=False):
    return _nan_arg_extreme(argmax, -np.inf, x, axis, keepdims)


def nanargmin(x, axis=None, keepdims=False):
    return _nan_arg_extreme(argmin, np.inf, x, axis, keepdims)


def ptp(x, axis=None, keepdims=False):
    x = b.tensor(x)
    if x.dtype == np.dtype(bool):
        raise TypeError(
            "ptp (max - min) is not defined for boolean tensors; cast to an "
            "integer dtype first."
        )
    return b.sub(
        max(x, axis=axis, keepdims=keepdims),
        min(x, axis=axis, keepdims=keepdims),
    )


def count_nonzero(x, axis=None):
    x, axes = _prepare(x, axis)
    nonzero = b.cast(b.ne(x, b.const(0, x.dtype)), "int32")
    return b.reduce(red.reduce_sum_p, nonzero, axes)


# ------------------------------------------------------------- cumulative


def _cumulative(prim, x, axis, dtype):
    x = b.tensor(x)
    if dtype is None:
        # Unlike sum, only booleans widen (to int32), as in JAX.
        dtype = b.kdtype(x)
    if dtype == "bool":
        dtype = "int32"
    x = b.cast(x, dtype)
    if axis is None:
        x = b.flatten(x)
        axis = 0
    elif x.ndim == 0:
        x = b.reshape(x, (1,))
        axis = b.axis_of(axis, 1)
    else:
        axis = b.axis_of(axis, x.ndim)
    return prim.bind(x, axis=axis, reverse=False)


def cumsum(x, axis=None, dtype=None):
    return _cumulative(cumulative.cumsum_p, x, axis, dtype)


def cumprod(x, axis=None, dtype=None):
    return _cumulative(cumulative.cumprod_p, x, axis, dtype)


def nancumsum(x, axis=None, dtype=None):
    return cumsum(_replace_nan(x, 0), axis=axis, dtype=dtype)


def nancumprod(x, axis=None, dtype=None):
    return cumprod(_replace_nan(x, 1), axis=axis, dtype=dtype)


# -------------------------------------------------------- diff and trace


def diff(a, n=1, axis=-1):
    a = b.tensor(a)
    if n < 0:
        raise ValueError(f"diff: the order n must be >= 0, got n={n}")
    if n == 0:
        return a
    if a.ndim == 0:
        raise ValueError("diff needs a tensor of rank >= 1, got a scalar")
    axis = b.axis_of(axis, a.ndim)
    for _ in range(n):
        hi = b.slice_axis(a, axis, 1, None)
        lo = b.slice_axis(a, axis, None, -1)
        # Booleans differ or not (NumPy's rule), they cannot subtract.
        a = b.ne(hi, lo) if a.dtype == np.dtype(bool) else b.sub(hi, lo)
    return a


def trace(x, offset=0, axis1=0, axis2=1):
    x = b.tensor(x)
    if x.ndim < 2:
        raise ValueError(
            f"trace needs a tensor of rank >= 2, got shape {x.shape}"
        )
    axis1 = b.axis_of(axis1, x.ndim)
    axis2 = b.axis_of(axis2, x.ndim)
    if axis1 == axis2:
        raise ValueError(
            f"trace: axis1 and axis2 must differ, got {axis1} and {axis2}"
        )
    x = b.cast(x, _accumulator_dtype(b.kdtype(x)))
    rest = [i for i in range(x.ndim) if i not in (axis1, axis2)]
    x = b.transpose(x, rest + [axis1, axis2])
    rows = b.iota_like(x, x.ndim - 2)
    cols = b.iota_like(x, x.ndim - 1)
    mask = b.eq(b.add(rows, b.const(int(offset), "int32")), cols)
    on_diagonal = b.where(mask, x, b.const(0, x.dtype))
    return b.reduce_sum(on_diagonal, (x.ndim - 2, x.ndim - 1))


from keras_ipu.backend.numpy.statistics import *  # noqa: E402,F401,F403
from keras_ipu.backend.numpy.statistics import __all__ as _statistics_all  # noqa: E402
from keras_ipu.backend.numpy.sorting import *  # noqa: E402,F401,F403
from keras_ipu.backend.numpy.sorting import __all__ as _sorting_all  # noqa: E402

__all__ += _statistics_all + _sorting_all
