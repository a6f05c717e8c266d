"""Statistics of keras.ops.numpy: mean, average, var/std, median and
quantiles (with their nan-variants), correlation, trapezoid, histogram,
bincount. Re-exported by reductions.py.

Quantiles sort along the reduced axis and read the two neighbouring order
statistics through one-hot masks, so the same graph serves the plain and
the nan-variants (whose positions differ per slice) without a gather.
"""

import numpy as np

from keras.src.backend import config
from keras.src.backend.common import dtypes

from keras_ipu.backend import prims as b
from keras_ipu.device.primitives import dot as dot_prims
from keras_ipu.device.primitives import elementwise as ew
from keras_ipu.device.primitives import indexing
from keras_ipu.device.primitives import reduce as red
from keras_ipu.device.primitives import shape_rules
from keras_ipu.device.primitives import sort as sort_prims

__all__ = [
    "mean",
    "average",
    "var",
    "std",
    "nanmean",
    "nanvar",
    "nanstd",
    "median",
    "nanmedian",
    "quantile",
    "nanquantile",
    "percentile",
    "nanpercentile",
    "correlate",
    "corrcoef",
    "trapezoid",
    "histogram",
    "bincount",
]


def _float_dtypes(x, int64_to_floatx=False):
    """(compute dtype, result dtype) of a floating statistic of x: half
    types accumulate in float32 and round once at the end."""
    dtype = b.kdtype(x)
    if int64_to_floatx and dtype == "int64":
        result = config.floatx()
    elif "int" in dtype or dtype == "bool":
        result = dtypes.result_type(dtype, "float32")
    else:
        result = dtype
    compute = dtypes.result_type(result, "float32")
    return compute, result


def _compute_and_result_dtypes(x):
    """(compute, result) dtypes of a moment of x: at least float32 inside,
    Keras' result type with a Python float outside."""
    dtype = b.kdtype(x)
    return dtypes.result_type(dtype, "float32"), dtypes.result_type(dtype, float)


def _mean_dtypes(x):
    """(compute, result) dtypes of a mean or standard deviation: Keras gives
    int64 inputs floatx."""
    return _float_dtypes(x, int64_to_floatx=True)


def _moment_args(x, axis, dtypes_of=_compute_and_result_dtypes):
    """(x as a tensor, the axes `axis` names, compute dtype, result dtype):
    what each moment (mean, var, std and their nan-variants) starts from."""
    x = b.tensor(x)
    return (x, b.axes_of(axis, x.ndim)) + tuple(dtypes_of(x))


def _real(dtype):
    dtype = b.np_dtype(dtype)
    if dtype.kind == "c":
        return np.dtype(np.float32 if dtype.itemsize == 8 else np.float64)
    return dtype


def mean(x, axis=None, keepdims=False):
    x, axes, compute, result = _moment_args(x, axis, _mean_dtypes)
    xc = b.cast(x, compute)
    total = b.reduce_sum(xc, axes, keepdims)
    out = b.div(total, b.count(x, axes, compute, keepdims))
    return b.cast(out, result)


def _var(x, axes, keepdims, compute):
    xc = b.cast(x, compute)
    n = b.count(x, axes, compute, keepdims=True)
    centred = b.sub(xc, b.div(b.reduce_sum(xc, axes, True), n))
    sq = b.square_abs(centred)
    out = b.div(b.reduce_sum(sq, axes, True), b.cast(n, sq.dtype))
    return out if keepdims else b.squeeze(out, axes)


def var(x, axis=None, keepdims=False):
    x, axes, compute, result = _moment_args(x, axis)
    return b.cast(_var(x, axes, keepdims, compute), _real(result))


def std(x, axis=None, keepdims=False):
    x, axes, compute, result = _moment_args(x, axis, _mean_dtypes)
    out = b.sqrt(_var(x, axes, keepdims, compute))
    return b.cast(out, _real(result))


def average(x, axis=None, weights=None):
    x = b.tensor(x)
    if weights is None:
        dtype = dtypes.result_type(b.kdtype(x), float)
        return mean(b.cast(x, dtype), axis=axis)
    weights = b.tensor(weights)
    dtype = dtypes.result_type(b.kdtype(x), float, b.kdtype(weights))
    x = b.cast(x, dtype)
    weights = b.cast(weights, dtype)
    axes = b.axes_of(axis, x.ndim)
    if weights.ndim != x.ndim:
        if axis is None or len(axes) != 1 or weights.ndim != 1:
            raise ValueError(
                f"average: weights of shape {weights.shape} do not match x of "
                f"shape {x.shape}. Pass weights of x's shape, or 1-D weights "
                "with one integer `axis` along which they apply."
            )
        shape = [1] * x.ndim
        shape[axes[0]] = weights.shape[0]
        weights = b.reshape(weights, shape)
    total = b.reduce_sum(b.mul(x, weights), axes)
    norm = b.reduce_sum(b.broadcast_like(weights, x), axes)
    return b.div(total, norm)


# ------------------------------------------------------------ nan-aware


def _nan_stats(x, axes, keepdims, compute):
    """(sum of non-NaN values, count of non-NaN values, NaN-zeroed x)."""
    xc = b.cast(x, compute)
    nan = b.isnan(xc)
    clean = b.where(nan, b.const(0, compute), xc)
    n = b.reduce_sum(b.cast(b.logical_not(nan), _real(compute)), axes, keepdims)
    return b.reduce_sum(clean, axes, keepdims), n, clean, nan


def nanmean(x, axis=None, keepdims=False):
    x, axes, compute, result = _moment_args(x, axis)
    total, n, _, _ = _nan_stats(x, axes, keepdims, compute)
    return b.cast(b.div(total, b.cast(n, total.dtype)), result)


def _nanvar(x, axes, keepdims, compute):
    total, n, clean, nan = _nan_stats(x, axes, True, compute)
    centred = b.sub(clean, b.div(total, b.cast(n, total.dtype)))
    sq = b.where(nan, b.const(0, _real(compute)), b.square_abs(centred))
    out = b.div(b.reduce_sum(sq, axes, True), n)
    return out if keepdims else b.squeeze(out, axes)


def nanvar(x, axis=None, keepdims=False):
    x, axes, compute, result = _moment_args(x, axis)
    return b.cast(_nanvar(x, axes, keepdims, compute), _real(result))


def nanstd(x, axis=None, keepdims=False):
    x, axes, compute, result = _moment_args(x, axis)
    out = b.sqrt(_nanvar(x, axes, keepdims, compute))
    return b.cast(out, _real(result))


# ------------------------------------------------------------ quantiles

_METHODS = ("linear", "lower", "higher", "midpoint", "nearest")


def _quantile_dtype(x):
    dtype = b.kdtype(x)
    if dtype == "bool":
        dtype = config.floatx()
    if dtype == "int64":
        return config.floatx()
    return dtypes.result_type(dtype, float)


def _to_last_axis(x, axes):
    """x with the reduced axes merged into one last axis."""
    rest = [i for i in range(x.ndim) if i not in axes]
    x = b.transpose(x, rest + list(axes))
    n = shape_rules.mul_dims([x.shape[a] for a in range(len(rest), x.ndim)])
    return b.reshape(x, [x.shape[i] for i in range(len(rest))] + [n])


def _order_statistics(pos, method):
    """The order statistics each quantile reads: (index, weight) pairs,
    indices as floats, weights as tensors or static floats."""
    lo = ew.floor_p.bind(pos)
    hi = ew.ceil_p.bind(pos)
    if method == "linear":
        t = b.sub(pos, lo)
        return [(lo, b.sub(b.const(1, pos.dtype), t)), (hi, t)]
    if method == "midpoint":
        return [(lo, 0.5), (hi, 0.5)]
    if method == "lower":
        return [(lo, 1.0)]
    if method == "higher":
        return [(hi, 1.0)]
    # nearest: ties go to the even index, as NumPy does.
    return [(ew.round_p.bind(pos), 1.0)]


def _quantile(x, q, axis, method, keepdims, ignore_nan, result_dtype=None):
    if method not in _METHODS:
        raise ValueError(
            f"Invalid value for `method`: {method!r}. Expected one of "
            f"{list(_METHODS)}."
        )
    x = b.tensor(x)
    dtype = _quantile_dtype(x) if result_dtype is None else result_dtype
    x = b.cast(x, dtype)
    in_shape = x.shape
    axes = b.axes_of(axis, x.ndim)
    # Half types work in float32; float64 keeps its precision.
    work = b.np_dtype(dtype)
    work = work if work.itemsize >= 4 else np.dtype(np.float32)
    q = b.cast(b.tensor(q), work)
    q_shape = q.shape
    q = b.reshape(q, (-1,))  # (m,)

    x = b.cast(x, work)
    # The reduced axes become one last axis (a new one of size 1 for ()).
    x = _to_last_axis(x, axes) if axes else b.expand_dims(x, [x.ndim])
    (s,) = sort_prims.sort_p.bind(x, dimension=x.ndim - 1, num_keys=1)
    n_axis = s.ndim - 1
    nan = b.isnan(s)
    if ignore_nan:
        # NaNs sort last: the valid order statistics are the first n.
        n = b.reduce_sum(b.cast(b.logical_not(nan), work), (n_axis,), True)  # (...,1)
    else:
        n = b.count(s, (n_axis,), work, keepdims=True)
    pos = b.mul(q, b.sub(n, b.const(1, work)))  # (..., m) or (m,)

    ramp = b.iota_like(s, n_axis, work)
    ramp = b.expand_dims(ramp, [ramp.ndim - 1])  # (..., 1, n)
    s_row = b.expand_dims(s, [s.ndim - 1])  # (..., 1, n)

    def pick(index, weight):
        hit = b.eq(b.expand_dims(index, [index.ndim]), ramp)  # (..., m, n)
        if isinstance(weight, float):
            term = s_row if weight == 1.0 else b.mul(s_row, b.const(weight, work))
        else:
            weight = b.expand_dims(weight, [weight.ndim])
            # A zero weight must not turn an inf order statistic into NaN.
            hit = b.logical_and(hit, b.ne(weight, 0))
            term = b.mul(s_row, weight)
        picked = b.where(hit, term, b.const(0, work))
        return b.reduce_sum(picked, (picked.ndim - 1,))

    picks = [pick(i, w) for i, w in _order_statistics(pos, method)]
    out = picks[0] if len(picks) == 1 else b.add(*picks)  # (..., m)
    if ignore_nan:
        empty = b.eq(n, b.const(0, work))  # (..., 1)
        out = b.where(empty, b.const(np.nan, work), out)
    else:
        has_nan = b.expand_dims(b.reduce_sum(b.cast(nan, "int32"), (n_axis,)), [-1])
        out = b.where(b.gt(has_nan, 0), b.const(np.nan, work), out)

    # (rest..., m) -> q_shape + rest (+ kept axes as 1)
    out = b.moveaxis(out, out.ndim - 1, 0)
    if keepdims:
        rest_shape = [1 if i in axes else d for i, d in enumerate(in_shape)]
    else:
        rest_shape = [d for i, d in enumerate(in_shape) if i not in axes]
    out = b.reshape(out, list(q_shape) + rest_shape)
    return b.cast(out, dtype)


def quantile(x, q, axis=None, method="linear", keepdims=False):
    return _quantile(x, q, axis, method, keepdims, ignore_nan=False)


def nanquantile(x, q, axis=None, method="linear", keepdims=False):
    return _quantile(x, q, axis, method, keepdims, ignore_nan=True)


def _percent(q):
    q = b.tensor(q)
    if not b.is_float(q):
        q = b.cast(q, config.floatx())
    return b.div(q, b.const(100, q.dtype))


def percentile(x, q, axis=None, method="linear", keepdims=False):
    x = b.tensor(x)
    # Keras' symbolic rule: float inputs keep their dtype, others floatx.
    dtype = b.kdtype(x) if b.is_float(x) else config.floatx()
    return _quantile(x, _percent(q), axis, method, keepdims, False, dtype)


def nanpercentile(x, q, axis=None, method="linear", keepdims=False):
    return nanquantile(x, _percent(q), axis, method, keepdims)


def median(x, axis=None, keepdims=False):
    return quantile(x, 0.5, axis=axis, keepdims=keepdims)


def nanmedian(x, axis=None, keepdims=False):
    return nanquantile(x, 0.5, axis=axis, keepdims=keepdims)


# ------------------------------------------------------- correlation


def _correlate_dtype(x1, x2):
    dtype = dtypes.result_type(
        getattr(x1, "dtype", type(x1)), getattr(x2, "dtype", type(x2))
    )
    if dtype == "int64":
        return "float64"
    if dtype not in ("bfloat16", "float16", "float64", "complex64", "complex128"):
        return "float32"
    return dtype


def correlate(x1, x2, mode="valid"):
    if mode not in ("valid", "same", "full"):
        raise ValueError(
            "`mode` must be either `valid`, `same`, or `full`, but received: "
            f"{mode}"
        )
    dtype = _correlate_dtype(x1, x2)
    a = b.tensor(x1, dtype)
    v = b.tensor(x2, dtype)
    if a.ndim != 1 or v.ndim != 1:
        raise ValueError(
            f"correlate needs 1-D inputs, got shapes {a.shape} and {v.shape}"
        )
    n, m = a.shape[0], v.shape[0]
    if n is None or m is None:
        raise ValueError(
            "correlate needs inputs of known length (the output length "
            f"depends on them); got lengths {n} and {m}."
        )
    if n == 0 or m == 0:
        raise ValueError("correlate: inputs must not be empty")
    # Full correlation at lag k = a[k + j] * conj(v[j]) summed over j, for
    # k = -(m-1) .. n-1; out-of-range reads of `a` are zero.
    lags = np.arange(-(m - 1), n)
    index = lags[:, None] + np.arange(m)[None, :]
    # Negative indices would count from the end: send them past it instead.
    index = np.where(index < 0, n, index)[..., None]
    windows = indexing.gather_p.bind(
        a, b.const(index, "int32"), mode="fill", fill_value=0
    )
    full = dot_prims.dot_general_p.bind(
        windows, b.conj(v), dimension_numbers=(((1,), (0,)), ((), ()))
    )
    if mode == "full":
        return full
    if mode == "same":
        # NumPy centres the window on the full correlation.
        length = n if n >= m else m
        start = (m - 1) // 2 if n >= m else n // 2
    else:
        length = abs(n - m) + 1
        start = min(n, m) - 1
    return b.slice_axis(full, 0, start, start + length)


def corrcoef(x):
    x = b.tensor(x)
    dtype = b.kdtype(x)
    # Keras' symbolic rule for corrcoef.
    result = "float64" if dtype == "int64" else dtypes.result_type(dtype, float)
    if x.ndim > 2:
        raise ValueError(
            f"corrcoef needs a 1-D or 2-D input (rows are variables), got "
            f"shape {x.shape}"
        )
    compute = dtypes.result_type(result, "float32")
    xc = b.cast(x, compute)
    if xc.ndim == 1:
        xc = b.reshape(xc, (1, -1))
    n = b.count(xc, (1,), compute, keepdims=True)
    centred = b.sub(xc, b.div(b.reduce_sum(xc, (1,), True), n))
    cov = dot_prims.dot_general_p.bind(
        centred, b.conj(centred), dimension_numbers=(((1,), (1,)), ((), ()))
    )
    d = b.sqrt(b.reduce_sum(b.square_abs(centred), (1,)))  # (k,), real
    scale = b.mul(b.expand_dims(d, [1]), b.expand_dims(d, [0]))
    corr = b.div(cov, b.cast(scale, cov.dtype))
    if corr.dtype.kind != "c":
        corr = b.minimum(b.maximum(corr, b.const(-1, compute)), b.const(1, compute))
    if x.ndim == 1:
        corr = b.reshape(corr, ())
    return b.cast(corr, result)


def trapezoid(y, x=None, dx=1.0, axis=-1):
    y = b.tensor(y)
    result = dtypes.result_type(b.kdtype(y), float)
    y = b.cast(y, result)
    axis = b.axis_of(axis, y.ndim)
    pair_sum = b.add(b.slice_axis(y, axis, 1, None), b.slice_axis(y, axis, None, -1))
    if x is None:
        d = b.tensor(dx)
        d = b.cast(d, dtypes.result_type(result, b.kdtype(d)))
    else:
        x = b.tensor(x)
        x = b.cast(x, dtypes.result_type(result, b.kdtype(x)))
        if x.ndim == 1:
            d = b.sub(b.slice_axis(x, 0, 1, None), b.slice_axis(x, 0, None, -1))
            shape = [1] * y.ndim
            shape[axis] = d.shape[0]
            d = b.reshape(d, shape)
        else:
            xa = b.axis_of(axis - y.ndim, x.ndim)
            d = b.sub(b.slice_axis(x, xa, 1, None), b.slice_axis(x, xa, None, -1))
    dtype = dtypes.result_type(result, b.kdtype(d))
    terms = b.mul(b.cast(pair_sum, dtype), b.cast(d, dtype))
    out = b.div(b.reduce_sum(terms, (axis,)), b.const(2, dtype))
    return b.cast(out, result)


# ------------------------------------------------------------ counting


def histogram(x, bins=10, range=None):
    x = b.tensor(x)
    if x.ndim != 1:
        raise ValueError(
            f"Input tensor must be 1-dimensional, got shape {x.shape}"
        )
    if not isinstance(bins, int) or bins < 0:
        raise ValueError(
            f"Argument `bins` should be a non-negative integer. Received: "
            f"bins={bins}"
        )
    dtype = x.dtype if b.is_float(x) else b.np_dtype(config.floatx())
    # Half types bin in float32; float64 stays (result_type would demote).
    work = dtype if dtype.itemsize >= 4 else np.dtype(np.float32)
    xf = b.cast(x, work)
    if range is None:
        lo = red.reduce_min_p.bind(xf, axes=(0,))
        hi = red.reduce_max_p.bind(xf, axes=(0,))
    else:
        lo, hi = b.const(range[0], work), b.const(range[1], work)
    # An empty span widens by 0.5 each way, as NumPy does.
    same = b.eq(lo, hi)
    lo = b.where(same, b.sub(lo, b.const(0.5, work)), lo)
    hi = b.where(same, b.add(hi, b.const(0.5, work)), hi)
    # Edges as np.linspace rounds them (i * step + lo, the last one hi), so
    # that values on an edge land in the bin NumPy puts them in.
    step = b.div(b.sub(hi, lo), b.const(max(bins, 1), work))
    inner_edges = b.add(b.mul(b.iota(bins, work), step), lo)
    edges = b.concatenate([inner_edges, b.reshape(hi, (1,))], 0)
    # Bin i holds edges[i] <= x < edges[i+1]; the last bin also holds hi.
    inner = b.slice_axis(edges, 0, 1, -1)
    index = sort_prims.searchsorted_p.bind(inner, xf, side="right")
    inside = b.logical_and(b.ge(xf, lo), b.le(xf, hi))
    hit = b.logical_and(
        b.eq(b.expand_dims(index, [1]), b.iota(bins, "int32")),
        b.expand_dims(inside, [1]),
    )
    counts = b.reduce_sum(b.cast(hit, dtype), (0,))
    return counts, b.cast(edges, dtype)


def bincount(x, weights=None, minlength=0, sparse=False):
    if sparse:
        raise ValueError(
            "`sparse=True` is not supported by the ipu backend: IPU programs "
            "use dense tensors. Use sparse=False."
        )
    x = b.tensor(x)
    if weights is None:
        dtype = "int32"
        weights = b.ones_like(x, dtype)
    else:
        weights = b.tensor(weights)
        dtype = dtypes.result_type(b.kdtype(x), b.kdtype(weights))
        weights = b.cast(weights, dtype)
    if minlength and (b.is_traced(x) or b.is_traced(weights)):
        # Compiled: the IPU needs a static length; minlength gives it, and
        # a larger value fails at run time (never a silently wrong count).
        return red.static_bincount_p.bind(x, weights, length=int(minlength))
    return red.bincount_p.bind(x, weights, minlength=int(minlength))
