"""Array creation and manipulation ops of keras.ops.numpy.

Everything that moves, selects or creates data without arithmetic on it
is here; each op is a composition of the structural primitives (reshape,
transpose, broadcast_to, slice, concatenate, pad, rev, gather, iota) and a
few elementwise ones. Constants that depend only on static Python arguments
(eye, tri, window functions) are built once with NumPy, as the rules allow.
"""

import numpy as np

from keras.src.backend import config
from keras.src.backend.common import dtypes
from keras.src.backend.common import standardize_dtype

from keras_ipu.backend.core import convert_to_tensor
from keras_ipu.backend.dtype_utils import dtype_of
from keras_ipu.backend.dtype_utils import np_dtype
from keras_ipu.backend.prims import broadcast_to as _broadcast_to
from keras_ipu.backend.prims import cast as _cast
from keras_ipu.backend.prims import concatenate as _concat
from keras_ipu.backend.prims import reshape as _reshape
from keras_ipu.backend.prims import slice_axis as _slice_axis
from keras_ipu.backend.prims import tensor as _t
from keras_ipu.backend.prims import transpose as _transpose
from keras_ipu.device.array import Tensor
from keras_ipu.device.primitives import dynamic as dyn
from keras_ipu.device.primitives import elementwise as ew
from keras_ipu.device.primitives import indexing as ix
from keras_ipu.device.primitives import shape_rules
from keras_ipu.device.primitives import structure as st
from keras_ipu.device.trace import Tracer

__all__ = [
    "array", "ones", "zeros", "empty", "full", "ones_like", "zeros_like",
    "empty_like", "full_like", "arange", "linspace", "logspace", "geomspace",
    "eye", "identity", "tri", "tril", "triu", "diag", "diagflat", "diagonal",
    "meshgrid", "copy", "append", "concatenate", "stack", "hstack", "vstack",
    "dstack", "split", "array_split", "hsplit", "vsplit", "dsplit", "reshape",
    "ravel", "squeeze", "expand_dims", "transpose", "swapaxes", "moveaxis",
    "broadcast_to", "flip", "fliplr", "flipud", "roll", "rot90", "tile",
    "repeat", "pad", "take", "take_along_axis", "unravel_index", "nonzero",
    "unique", "ndim", "size", "kron", "vander", "bartlett", "blackman",
    "hamming", "hanning", "kaiser",
]  # fmt: skip

INDEX_DTYPE = np.dtype("int32")


# ----------------------------------------------------------- small helpers


def _axis(axis, ndim, name="axis"):
    if not isinstance(axis, (int, np.integer)) or isinstance(axis, bool):
        raise TypeError(f"`{name}` must be an integer, got {axis!r}")
    if axis < -ndim or axis >= ndim:
        raise ValueError(
            f"{name} {axis} is out of bounds for an array of rank {ndim}; "
            f"use a value in [{-ndim}, {ndim})"
        )
    return int(axis) % ndim


def _axes(axis, ndim):
    if isinstance(axis, (int, np.integer)):
        axis = (axis,)
    return tuple(_axis(a, ndim) for a in axis)


def _static_int(v, name):
    """A static integer argument (a Python int or an eager integer Tensor)."""
    if isinstance(v, (bool, np.bool_)):
        return int(v)
    if isinstance(v, (int, np.integer)):
        return int(v)
    if isinstance(v, Tracer):
        raise TypeError(
            f"`{name}` must be a static integer, got a traced value "
            f"{v.aval.short()}; array shapes must be known when tracing"
        )
    dtype = getattr(v, "dtype", None)
    if dtype is not None and np.dtype(dtype).kind in "iub":
        if np.ndim(v) == 0:
            return int(np.asarray(v))
    raise TypeError(f"`{name}` must be an integer, got {v!r}")


def _static_ints(v, name):
    if isinstance(v, (list, tuple)):
        return tuple(_static_int(e, name) for e in v)
    if isinstance(v, Tracer):
        return (_static_int(v, name),)
    if np.ndim(v) == 0:
        return (_static_int(v, name),)
    return tuple(int(e) for e in np.asarray(v).reshape(-1))


def _broadcast(x, shape):
    shape = tuple(shape)
    if tuple(x.shape) == shape:
        return x
    if None in shape and not isinstance(x, Tracer):
        raise ValueError(f"cannot broadcast a concrete array to {shape}")
    return _broadcast_to(x, shape)


def _scalar(value, dtype):
    """A 0-d operand of `dtype` (a NumPy constant, or a cast tensor)."""
    if isinstance(value, (Tensor, Tracer)) or hasattr(value, "value"):
        v = _cast(_t(value), dtype)
        if v.ndim:
            v = _reshape(v, ())
        return v
    return np.asarray(value, dtype=np_dtype(dtype))


def _filled(shape, value, dtype, like=None):
    """An array of `shape` filled with `value`. Unknown (None) dims are only
    possible while tracing, with `like` a Tracer of that shape."""
    shape = tuple(shape)
    fill = _scalar(value, dtype)
    if None in shape:
        # A node of `like`'s shape: select(True, fill, like) is fill
        # everywhere and keeps the unknown dims symbolic.
        return ew.select_p.bind(np.bool_(True), fill, _cast(like, dtype))
    if isinstance(fill, np.ndarray):
        return Tensor(np.full(shape, fill, dtype=fill.dtype))
    return _broadcast(fill, shape)


def _promote_all(xs):
    xs = [x if hasattr(x, "dtype") else _t(x) for x in xs]
    dtype = dtypes.result_type(*(dtype_of(x) for x in xs))
    return [_t(x, dtype) for x in xs]


def _binary(prim, a, b):
    a, b = _promote_all([a, b])
    return prim.bind(a, b)


# ------------------------------------------------------------- creation


def array(x, dtype=None):
    return convert_to_tensor(x, dtype=dtype)


def _shape_arg(shape):
    if isinstance(shape, (int, np.integer)) or (
        hasattr(shape, "ndim") and shape.ndim == 0
    ):
        return (_static_int(shape, "shape"),)
    return tuple(_static_int(d, "shape") for d in shape)


def zeros(shape, dtype=None):
    dtype = standardize_dtype(dtype or config.floatx())
    return Tensor(np.zeros(_shape_arg(shape), dtype=np_dtype(dtype)))


def ones(shape, dtype=None):
    dtype = standardize_dtype(dtype or config.floatx())
    return Tensor(np.ones(_shape_arg(shape), dtype=np_dtype(dtype)))


def empty(shape, dtype=None):
    # Zero-filled: deterministic, as the JAX backend.
    return zeros(shape, dtype)


def full(shape, fill_value, dtype=None):
    dtype = standardize_dtype(dtype or config.floatx())
    shape = _shape_arg(shape)
    if isinstance(fill_value, (int, float, bool, complex)):
        return _filled(shape, fill_value, dtype)
    fill = _t(fill_value, dtype)
    return _broadcast(fill, shape)


def _like_dtype(x, dtype):
    return standardize_dtype(dtype) if dtype is not None else x.dtype


def full_like(x, fill_value, dtype=None):
    x = _t(x)
    dtype = _like_dtype(x, dtype)
    if isinstance(fill_value, (int, float, bool, complex)):
        return _filled(x.shape, fill_value, dtype, like=x)
    fill = _t(fill_value, dtype)
    if None in x.shape:
        return ew.add_p.bind(*_promote_all([_filled(x.shape, 0, dtype, x), fill]))
    return _broadcast(fill, x.shape)


def zeros_like(x, dtype=None):
    return full_like(x, 0, dtype)


def ones_like(x, dtype=None):
    return full_like(x, 1, dtype)


def empty_like(x, dtype=None):
    return full_like(x, 0, dtype)


def _static_number(v, name):
    if isinstance(v, Tracer):
        raise TypeError(
            f"`{name}` must be static (a Python number or an eager tensor): "
            "the output length depends on it"
        )
    if isinstance(v, (int, float, np.number)):
        return v
    return np.asarray(v).item()


def arange(start, stop=None, step=None, dtype=None):
    if dtype is None:
        parts = [start] + [v for v in (stop, step) if v is not None]
        dtype = dtypes.result_type(
            *(getattr(v, "dtype", type(v)) for v in parts)
        )
    dtype = standardize_dtype(dtype)
    start = _static_number(start, "start")
    stop = None if stop is None else _static_number(stop, "stop")
    step = 1 if step is None else _static_number(step, "step")
    if stop is None:
        start, stop = 0, start
    return Tensor(np.arange(start, stop, step, dtype=np_dtype(dtype)))


def _ramp(num, dtype):
    return st.iota_p.bind(dtype=np_dtype(dtype), shape=(num,), dimension=0)


def linspace(
    start, stop, num=50, endpoint=True, retstep=False, dtype=None, axis=0
):
    num = _static_int(num, "num")
    if num < 0:
        raise ValueError(f"linspace: `num` must be >= 0, got {num}")
    if dtype is None:
        dtype = dtypes.result_type(dtype_of(start), dtype_of(stop), float)
    dtype = standardize_dtype(dtype)
    compute = dtypes.result_type(dtype_of(start), dtype_of(stop), float)
    if np_dtype(dtype).kind in "fc":
        compute = dtypes.result_type(compute, dtype)
    start = _t(start, compute)
    stop = _t(stop, compute)
    bshape = shape_rules.broadcast_shapes(start.shape, stop.shape)
    start, stop = _broadcast(start, bshape), _broadcast(stop, bshape)
    div = (num - 1) if endpoint else num
    delta = ew.sub_p.bind(stop, start)
    step = ew.div_p.bind(delta, np.asarray(max(div, 1), np_dtype(compute)))
    ramp = _reshape(_ramp(num, compute), (num,) + (1,) * len(bshape))
    out = ew.add_p.bind(start, ew.mul_p.bind(ramp, step))
    if endpoint and num > 1:
        # The last sample is exactly `stop`, as NumPy guarantees.
        out = _concat(
            [_slice_axis(out, 0, 0, num - 1), _reshape(stop, (1,) + bshape)], 0
        )
    out = moveaxis(out, 0, axis) if bshape else out
    if np_dtype(dtype).kind in "iu":
        out = ew.floor_p.bind(out)
    out = _cast(out, dtype)
    if retstep:
        if div == 0:
            step = _filled(step.shape, np.nan, compute)
        return out, _cast(step, dtype)
    return out


def logspace(start, stop, num=50, endpoint=True, base=10, dtype=None, axis=0):
    if dtype is None:
        dtype = dtypes.result_type(dtype_of(start), dtype_of(stop), float)
    dtype = standardize_dtype(dtype)
    compute = dtypes.result_type(dtype_of(start), dtype_of(stop), float)
    exps = linspace(start, stop, num, endpoint, dtype=compute, axis=axis)
    out = _binary(ew.pow_p, _t(base, compute), exps)
    return _cast(out, dtype)


def geomspace(start, stop, num=50, endpoint=True, dtype=None, axis=0):
    dtype = standardize_dtype(dtype or config.floatx())
    compute = dtypes.result_type(dtype_of(start), dtype_of(stop), float)
    start, stop = _t(start, compute), _t(stop, compute)
    # Negative ranges keep their sign; the logs are of magnitudes.
    sign = ew.sign_p.bind(start)
    logs = [ew.log_p.bind(ew.abs_p.bind(v)) for v in (start, stop)]
    out = ew.mul_p.bind(
        sign, ew.exp_p.bind(linspace(*logs, num, endpoint, dtype=compute))
    )
    num = _static_int(num, "num")
    if num > 0:
        ends = [_reshape(start, (1,) + start.shape)]
        middle_stop = num - 1 if (endpoint and num > 1) else num
        parts = ends + [_slice_axis(out, 0, 1, middle_stop)]
        if endpoint and num > 1:
            parts.append(_reshape(stop, (1,) + stop.shape))
        out = _concat(parts, 0)
    out = moveaxis(out, 0, axis) if out.ndim > 1 else out
    return _cast(out, dtype)


def eye(N, M=None, k=0, dtype=None):
    dtype = standardize_dtype(dtype or config.floatx())
    N = _static_int(N, "N")
    M = N if M is None else _static_int(M, "M")
    k = _static_int(k, "k")
    return Tensor(np.eye(N, M, k=k, dtype=np_dtype(dtype)))


def identity(n, dtype=None):
    return eye(n, dtype=dtype)


def tri(N, M=None, k=0, dtype=None):
    dtype = standardize_dtype(dtype or config.floatx())
    N = _static_int(N, "N")
    M = N if M is None else _static_int(M, "M")
    return Tensor(np.tri(N, M, k=_static_int(k, "k"), dtype=np_dtype(dtype)))


def _triangle(x, k, lower):
    x = _t(x)
    if x.ndim < 2:
        raise ValueError(
            f"tril/triu need an input of rank >= 2, got shape {x.shape}"
        )
    rows, cols = x.shape[-2:]
    if rows is None or cols is None:
        raise ValueError(
            f"tril/triu need known last two dimensions, got shape {x.shape}"
        )
    k = _static_int(k, "k")
    mask = np.tri(rows, cols, k=k if lower else k - 1, dtype=bool)
    if not lower:
        mask = ~mask
    return ew.select_p.bind(mask, x, np.zeros((), x.dtype))


def tril(x, k=0):
    return _triangle(x, k, lower=True)


def triu(x, k=0):
    return _triangle(x, k, lower=False)


def diag(x, k=0):
    x = _t(x)
    k = _static_int(k, "k")
    if x.ndim == 2:
        return diagonal(x, k)
    if x.ndim != 1:
        raise ValueError(f"diag: input must be 1-D or 2-D, got shape {x.shape}")
    m = x.shape[0]
    if m is None:
        raise ValueError("diag: the length of a 1-D input must be known")
    n = m + abs(k)
    if m == 0:
        return _filled((n, n), 0, x.dtype)
    # The diagonal of an n x n matrix is every (n+1)-th element of its
    # flattening: interior padding writes it without any index arithmetic.
    lo = k if k >= 0 else -k * n
    hi = n * n - lo - m - (m - 1) * n
    flat = st.pad_p.bind(x, np.zeros((), x.dtype), config=((lo, hi, n),))
    return _reshape(flat, (n, n))


def diagflat(x, k=0):
    return diag(ravel(x), k)


def diagonal(x, offset=0, axis1=0, axis2=1):
    x = _t(x)
    offset = _static_int(offset, "offset")
    a1, a2 = _axis(axis1, x.ndim, "axis1"), _axis(axis2, x.ndim, "axis2")
    if a1 == a2:
        raise ValueError("diagonal: axis1 and axis2 cannot be the same")
    rest = [i for i in range(x.ndim) if i not in (a1, a2)]
    x = _transpose(x, rest + [a1, a2])
    rows, cols = x.shape[-2:]
    if rows is None or cols is None:
        raise ValueError(
            f"diagonal needs known sizes on axis1/axis2, got {x.shape}"
        )
    r0, c0 = max(-offset, 0), max(offset, 0)
    n = max(0, min(rows - r0, cols - c0))
    lead = x.shape[:-2]
    square = ix.slice_p.bind(
        x,
        start_indices=(0,) * len(lead) + (r0, c0),
        limit_indices=(None,) * len(lead) + (r0 + n, c0 + n),
        strides=(1,) * x.ndim,
    )
    flat = _reshape(square, lead + (n * n,))
    return _slice_axis(flat, len(lead), 0, None, n + 1)


def meshgrid(*x, indexing="xy"):
    if indexing not in ("xy", "ij"):
        raise ValueError(
            f"meshgrid: indexing must be 'xy' or 'ij', got {indexing!r}"
        )
    xs = [ravel(v) for v in x]
    shape = [v.shape[0] for v in xs]
    if indexing == "xy" and len(xs) > 1:
        shape[0], shape[1] = shape[1], shape[0]
    out = []
    for i, v in enumerate(xs):
        pos = i
        if indexing == "xy" and len(xs) > 1 and i < 2:
            pos = 1 - i
        view = [1] * len(xs)
        view[pos] = v.shape[0]
        out.append(_broadcast(_reshape(v, view), shape))
    return out


def copy(x):
    # Tensors are immutable, so sharing is a copy; NumPy inputs are copied
    # by the conversion.
    return _t(x)


# ------------------------------------------------------ join and split


def concatenate(xs, axis=0):
    xs = _promote_all(xs)
    if axis is None:
        return _concat([ravel(x) for x in xs], 0)
    if xs[0].ndim == 0:
        raise ValueError("concatenate: zero-dimensional arrays cannot be joined")
    return _concat(xs, _axis(axis, xs[0].ndim))


def append(x1, x2, axis=None):
    return concatenate([x1, x2], axis=axis)


def stack(x, axis=0):
    xs = _promote_all(x)
    if not xs:
        raise ValueError("stack: needs at least one array")
    axis = _axis(axis, xs[0].ndim + 1)
    return _concat([expand_dims(v, axis) for v in xs], axis)


def _at_least(x, n):
    x = _t(x)
    if x.ndim >= n:
        return x
    if n == 2:
        return _reshape(x, (1,) * (2 - x.ndim) + tuple(x.shape))
    # atleast_3d: (N,) -> (1, N, 1), (M, N) -> (M, N, 1)
    shape = {0: (1, 1, 1), 1: (1,) + tuple(x.shape) + (1,)}.get(
        x.ndim, tuple(x.shape) + (1,)
    )
    return _reshape(x, shape)


def hstack(xs):
    xs = _promote_all(xs)
    xs = [_reshape(x, (1,)) if x.ndim == 0 else x for x in xs]
    return _concat(xs, 0 if xs[0].ndim == 1 else 1)


def vstack(xs):
    return _concat([_at_least(x, 2) for x in _promote_all(xs)], 0)


def dstack(xs):
    return _concat([_at_least(x, 3) for x in _promote_all(xs)], 2)


def _split_points(n, indices_or_sections, equal):
    if isinstance(indices_or_sections, (int, np.integer)) or (
        np.ndim(indices_or_sections) == 0
        and not isinstance(indices_or_sections, (list, tuple))
    ):
        sections = _static_int(indices_or_sections, "indices_or_sections")
        if sections <= 0:
            raise ValueError(f"split: number of sections must be > 0, got {sections}")
        if n is None:
            raise ValueError(
                "split: the size of the split axis must be known to split it "
                "into sections"
            )
        if equal and n % sections:
            raise ValueError(
                f"array split does not result in an equal division: size {n} "
                f"into {sections} sections. Use array_split for unequal parts."
            )
        base, extra = divmod(n, sections)
        sizes = [base + 1] * extra + [base] * (sections - extra)
        return list(np.cumsum([0] + sizes))
    points = list(_static_ints(indices_or_sections, "indices_or_sections"))
    return [0] + points + [None]


def _split(x, indices_or_sections, axis, equal):
    x = _t(x)
    axis = _axis(axis, x.ndim)
    pts = _split_points(x.shape[axis], indices_or_sections, equal)
    return [
        _slice_axis(x, axis, _opt_int(a), _opt_int(b))
        for a, b in zip(pts[:-1], pts[1:])
    ]


def _opt_int(v):
    return None if v is None else int(v)


def split(x, indices_or_sections, axis=0):
    return _split(x, indices_or_sections, axis, equal=True)


def array_split(x, indices_or_sections, axis=0):
    return _split(x, indices_or_sections, axis, equal=False)


def hsplit(x, indices_or_sections):
    x = _t(x)
    return split(x, indices_or_sections, axis=0 if x.ndim == 1 else 1)


def vsplit(x, indices_or_sections):
    x = _t(x)
    if x.ndim < 2:
        raise ValueError("vsplit only works on arrays of 2 or more dimensions")
    return split(x, indices_or_sections, axis=0)


def dsplit(x, indices_or_sections):
    x = _t(x)
    if x.ndim < 3:
        raise ValueError("dsplit only works on arrays of 3 or more dimensions")
    return split(x, indices_or_sections, axis=2)


# ------------------------------------------------------------ reshaping


def reshape(x, newshape):
    x = _t(x)
    if isinstance(newshape, (int, np.integer)) or np.ndim(newshape) == 0:
        newshape = (newshape,)
    newshape = tuple(
        -1 if d is None else _static_int(d, "newshape") for d in newshape
    )
    for d in newshape:
        if d < -1:
            raise ValueError(
                "Every entry of `newshape` must be a non-negative integer or "
                f"-1 (one inferred dimension). Received: newshape={newshape}"
            )
    if newshape.count(-1) > 1:
        raise ValueError(
            "`newshape` can have at most one unknown dimension (-1). "
            f"Received: newshape={newshape}"
        )
    return _reshape(x, newshape)


def ravel(x):
    x = _t(x)
    return _reshape(x, (-1,))


def squeeze(x, axis=None):
    x = _t(x)
    if axis is None:
        axes = tuple(i for i, d in enumerate(x.shape) if d == 1)
    else:
        axes = _axes(axis, x.ndim)
        for a in axes:
            if x.shape[a] not in (1, None):
                raise ValueError(
                    f"Cannot squeeze axis {a} of size {x.shape[a]} (shape "
                    f"{x.shape}): only size-1 axes can be removed"
                )
    shape = tuple(d for i, d in enumerate(x.shape) if i not in axes)
    return _reshape(x, _fill_unknown(shape))


def _fill_unknown(shape):
    # reshape_p infers one -1; several unknown dims stay None (traced only).
    if shape.count(None) == 1:
        return tuple(-1 if d is None else d for d in shape)
    return shape


def expand_dims(x, axis):
    x = _t(x)
    axes = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    out_ndim = x.ndim + len(axes)
    axes = set(_axis(a, out_ndim) for a in axes)
    dims = iter(x.shape)
    shape = tuple(1 if i in axes else next(dims) for i in range(out_ndim))
    return _reshape(x, _fill_unknown(shape))


def transpose(x, axes=None):
    x = _t(x)
    if axes is None:
        return _transpose(x, tuple(reversed(range(x.ndim))))
    axes = tuple(axes)
    if len(axes) != x.ndim:
        raise ValueError(
            "`axes` must be a list of the same length as the input shape: "
            f"got axes={list(axes)} for shape {x.shape}"
        )
    perm = _axes(axes, x.ndim)
    if sorted(perm) != list(range(x.ndim)):
        raise ValueError(
            f"`axes` must be a valid permutation of the input axes; got "
            f"axes={list(axes)}"
        )
    return _transpose(x, perm)


def swapaxes(x, axis1, axis2):
    x = _t(x)
    a, b = _axis(axis1, x.ndim), _axis(axis2, x.ndim)
    perm = list(range(x.ndim))
    perm[a], perm[b] = perm[b], perm[a]
    return _transpose(x, perm)


def moveaxis(x, source, destination):
    x = _t(x)
    src = _axes(source, x.ndim)
    dst = _axes(destination, x.ndim)
    if len(src) != len(dst):
        raise ValueError(
            "moveaxis: `source` and `destination` need the same number of "
            f"axes, got {source} and {destination}"
        )
    perm = [i for i in range(x.ndim) if i not in src]
    for d, s in sorted(zip(dst, src)):
        perm.insert(d, s)
    return _transpose(x, perm)


def broadcast_to(x, shape):
    x = _t(x)
    shape = _shape_arg(shape) if not isinstance(shape, (tuple, list)) else tuple(
        None if d is None else _static_int(d, "shape") for d in shape
    )
    try:
        return _broadcast(x, shape)
    except shape_rules.ShapeError as e:
        raise ValueError(str(e)) from None


def flip(x, axis=None):
    x = _t(x)
    axes = tuple(range(x.ndim)) if axis is None else _axes(axis, x.ndim)
    if not axes:
        return x
    return st.rev_p.bind(x, axes=axes)


def fliplr(x):
    x = _t(x)
    if x.ndim < 2:
        raise ValueError("fliplr needs an input of rank >= 2")
    return flip(x, 1)


def flipud(x):
    x = _t(x)
    if x.ndim < 1:
        raise ValueError("flipud needs an input of rank >= 1")
    return flip(x, 0)


def _roll_axis(x, shift, axis):
    n = x.shape[axis]
    if n is None:
        raise ValueError(f"roll needs a known size on axis {axis}: {x.shape}")
    if n == 0:
        return x
    if isinstance(shift, (Tensor, Tracer)):
        # A shift known only at run time: read a window of x twice over.
        doubled = _concat([x, x], axis)
        start = ew.mod_p.bind(
            ew.sub_p.bind(np.asarray(n, shift.dtype), shift),
            np.asarray(n, shift.dtype),
        )
        zero = np.asarray(0, shift.dtype)
        starts = [start if i == axis else zero for i in range(x.ndim)]
        return ix.dynamic_slice_p.bind(doubled, *starts, slice_sizes=tuple(
            n if i == axis else d for i, d in enumerate(x.shape)
        ))
    s = int(shift) % n
    if s == 0:
        return x
    return _concat(
        [_slice_axis(x, axis, n - s, None), _slice_axis(x, axis, 0, n - s)], axis
    )


def roll(x, shift, axis=None):
    x = _t(x)
    if axis is None:
        return _reshape(roll(ravel(x), shift, 0), x.shape)
    axes = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    if isinstance(shift, (int, np.integer)) or (
        isinstance(shift, (Tensor, Tracer)) and shift.ndim == 0
    ):
        shifts = [shift] * len(axes)
    else:
        shifts = list(_static_ints(shift, "shift"))
        if len(axes) == 1 and len(shifts) > 1:
            axes = axes * len(shifts)
        if len(shifts) != len(axes):
            raise ValueError("roll: `shift` and `axis` must have the same length")
    for s, a in zip(shifts, axes):
        if isinstance(s, (Tensor, Tracer)):
            s = _t(s)
            if s.dtype.kind not in "iu":
                s = _cast(s, "int32")
        x = _roll_axis(x, s, _axis(a, x.ndim))
    return x


def rot90(array, k=1, axes=(0, 1)):
    x = _t(array)
    if x.ndim < 2:
        raise ValueError(
            f"rot90 needs an input of rank >= 2, got shape {x.shape}"
        )
    if len(axes) != 2:
        raise ValueError(f"rot90: `axes` must have two entries, got {axes}")
    a, b = _axis(axes[0], x.ndim), _axis(axes[1], x.ndim)
    if a == b:
        raise ValueError(f"rot90: the two `axes` must differ, got {axes}")
    k = _static_int(k, "k") % 4
    if k == 0:
        return x
    if k == 2:
        return flip(x, (a, b))
    perm = list(range(x.ndim))
    perm[a], perm[b] = perm[b], perm[a]
    if k == 1:
        return _transpose(flip(x, b), perm)
    return flip(_transpose(x, perm), b)


def tile(x, repeats):
    x = _t(x)
    reps = _static_ints(repeats, "repeats")
    n = max(x.ndim, len(reps))
    reps = (1,) * (n - len(reps)) + tuple(reps)
    shape = (1,) * (n - x.ndim) + tuple(x.shape)
    if all(r == 1 for r in reps):
        return _reshape(x, shape)
    # (d0, d1) -> (1, d0, 1, d1) -> (r0, d0, r1, d1) -> (r0*d0, r1*d1)
    view = tuple(v for d in shape for v in (1, d))
    wide = tuple(v for r, d in zip(reps, shape) for v in (r, d))
    out = _broadcast(_reshape(x, _fill_unknown(view)), wide)
    final = tuple(None if d is None else r * d for r, d in zip(reps, shape))
    return _reshape(out, _fill_unknown(final))


def repeat(x, repeats, axis=None):
    x = _t(x)
    if axis is None:
        x, axis = ravel(x), 0
    axis = _axis(axis, x.ndim)
    counts = _static_ints(repeats, "repeats")
    n = x.shape[axis]
    if len(counts) == 1:
        r = counts[0]
        # (.., d, ..) -> (.., d, 1, ..) -> (.., d, r, ..) -> (.., d*r, ..)
        view = x.shape[: axis + 1] + (1,) + x.shape[axis + 1 :]
        wide = x.shape[: axis + 1] + (r,) + x.shape[axis + 1 :]
        out = _broadcast(_reshape(x, _fill_unknown(view)), wide)
        final = x.shape[:axis] + (None if n is None else n * r,) + x.shape[axis + 1 :]
        return _reshape(out, _fill_unknown(final))
    if n is not None and len(counts) != n:
        raise ValueError(
            f"repeat: `repeats` has {len(counts)} entries for an axis of size {n}"
        )
    index = np.repeat(np.arange(len(counts)), counts).astype(INDEX_DTYPE)
    return take(x, index, axis=axis)


def _pad_widths(pad_width, ndim):
    pw = np.asarray(
        pad_width if not isinstance(pad_width, (Tensor, Tracer)) else
        _static_ints(pad_width, "pad_width"),
        dtype=np.int64,
    )
    if pw.ndim == 0:
        pw = np.full((ndim, 2), pw)
    elif pw.ndim == 1:
        # (a,) pads every side by a; (a, b) pads every axis by (a, b).
        row = pw.reshape(1, -1) if pw.size == 2 else pw.reshape(-1, 1)
        pw = np.broadcast_to(row, (ndim, 2))
    else:
        pw = np.broadcast_to(pw, (ndim, 2))
    if (pw < 0).any():
        raise ValueError(f"pad: widths must be >= 0, got {pad_width}")
    return [tuple(int(v) for v in row) for row in pw]


def _pad_reflect(x, axis, lo, hi, mode):
    n = x.shape[axis]
    if n is None:
        raise ValueError(f"pad mode {mode!r} needs a known size on axis {axis}")
    if mode == "edge":
        parts = [_slice_axis(x, axis, 0, 1)] * lo + [x]
        parts += [_slice_axis(x, axis, n - 1, n)] * hi
        return _concat(parts, axis)
    if mode == "wrap":
        before = _slice_axis(x, axis, n - lo, n) if lo else None
        after = _slice_axis(x, axis, 0, hi) if hi else None
        if lo > n or hi > n:
            raise ValueError("pad mode 'wrap' with widths > the axis size")
        return _concat([p for p in (before, x, after) if p is not None], axis)
    skip = 1 if mode == "reflect" else 0
    limit = n - skip
    if lo > limit or hi > limit:
        raise ValueError(
            f"pad mode {mode!r}: widths ({lo}, {hi}) must be at most {limit} "
            f"for an axis of size {n}"
        )
    parts = []
    if lo:
        parts.append(st.rev_p.bind(_slice_axis(x, axis, skip, skip + lo), axes=(axis,)))
    parts.append(x)
    if hi:
        parts.append(
            st.rev_p.bind(_slice_axis(x, axis, n - skip - hi, n - skip), axes=(axis,))
        )
    return _concat(parts, axis)


def pad(x, pad_width, mode="constant", constant_values=None):
    x = _t(x)
    if constant_values is not None and mode != "constant":
        raise ValueError(
            "Argument `constant_values` can only be provided when "
            f"`mode == 'constant'`. Received: mode={mode}"
        )
    widths = _pad_widths(pad_width, x.ndim)
    if mode == "constant":
        if constant_values is not None and np.ndim(constant_values) != 0:
            raise ValueError(
                "pad: `constant_values` must be a scalar on the ipu backend, "
                f"got shape {np.shape(constant_values)}. Pad once per value "
                "(one pad call per axis) for per-axis constants."
            )
        value = _scalar(0 if constant_values is None else constant_values, x.dtype)
        return st.pad_p.bind(x, value, config=tuple((lo, hi, 0) for lo, hi in widths))
    if mode not in ("reflect", "symmetric", "edge", "wrap"):
        raise ValueError(
            f"pad: mode must be 'constant', 'reflect', 'symmetric', 'edge' or "
            f"'wrap'; got {mode!r}"
        )
    for axis, (lo, hi) in enumerate(widths):
        if lo or hi:
            x = _pad_reflect(x, axis, lo, hi, mode)
    return x


# ----------------------------------------------------------- gathering


def _index_tensor(indices):
    idx = _t(indices)
    if idx.dtype.kind not in "iu":
        if idx.dtype.kind == "b":
            raise TypeError("take: boolean indices are not supported; use a mask")
        idx = _cast(idx, "int32")
    return idx


def take(x, indices, axis=None):
    x = _t(x)
    idx = _index_tensor(indices)
    if axis is None:
        x, axis = ravel(x), 0
    axis = _axis(axis, x.ndim)
    front = moveaxis(x, axis, 0) if axis else x
    # Out-of-range indices give NaN (or the dtype's extreme), as jnp.take;
    # negative ones count from the end.
    out = ix.gather_p.bind(front, _reshape(idx, tuple(idx.shape) + (1,)), mode="fill")
    if axis == 0:
        return out
    # out: idx.shape + rest(x without axis, with x's leading dims first)
    k = idx.ndim
    perm = list(range(k, k + axis)) + list(range(k)) + list(range(k + axis, out.ndim))
    return _transpose(out, perm)


def take_along_axis(x, indices, axis=None):
    x = _t(x)
    idx = _index_tensor(indices)
    if axis is None:
        x, axis = ravel(x), 0
        if idx.ndim != 1:
            idx = ravel(idx)
    axis = _axis(axis, x.ndim)
    if idx.ndim != x.ndim:
        raise ValueError(
            f"take_along_axis: indices {idx.shape} and x {x.shape} need the "
            "same rank"
        )
    xm, im = moveaxis(x, axis, -1), moveaxis(idx, axis, -1)
    batch = shape_rules.broadcast_shapes(xm.shape[:-1], im.shape[:-1])
    xm = _broadcast(xm, batch + xm.shape[-1:])
    im = _broadcast(im, batch + im.shape[-1:])
    out = ix.gather_p.bind(
        xm, _reshape(im, _fill_unknown(im.shape + (1,))), mode="fill",
        batch_dims=len(batch),
    )
    return moveaxis(out, -1, axis)


def unravel_index(indices, shape):
    idx = _t(indices)
    shape = _static_ints(shape, "shape")
    out = []
    for d in reversed(shape):
        dim = np.asarray(d, idx.dtype)
        out.append(ew.mod_p.bind(idx, dim))
        idx = ew.floor_div_p.bind(idx, dim)
    return tuple(reversed(out))


def nonzero(x):
    return dyn.nonzero_p.bind(_t(x), index_dtype=INDEX_DTYPE)


def unique(
    x,
    sorted=True,
    return_index=False,
    return_inverse=False,
    return_counts=False,
    axis=None,
    size=None,
    fill_value=None,
):
    x = _t(x)
    if axis is not None:
        axis = _axis(axis, x.ndim)
    if size is None:
        outs = dyn.unique_p.bind(x, axis=axis, index_dtype=INDEX_DTYPE)
    else:
        if fill_value is not None:
            fill_value = np.asarray(fill_value, x.dtype).item()
        outs = dyn.unique_sized_p.bind(
            x,
            axis=axis,
            index_dtype=INDEX_DTYPE,
            size=_static_int(size, "size"),
            fill_value=fill_value,
        )
    values, index, inverse, counts = outs
    wanted = [values]
    for flag, v in ((return_index, index), (return_inverse, inverse),
                    (return_counts, counts)):  # fmt: skip
        if flag:
            wanted.append(v)
    return wanted[0] if len(wanted) == 1 else tuple(wanted)


def ndim(x):
    return len(_t(x).shape)


def size(x):
    return shape_rules.mul_dims(_t(x).shape)


# ---------------------------------------------------------- structured


def kron(x1, x2):
    a, b = _promote_all([x1, x2])
    n = max(a.ndim, b.ndim)
    a = _reshape(a, (1,) * (n - a.ndim) + tuple(a.shape))
    b = _reshape(b, (1,) * (n - b.ndim) + tuple(b.shape))
    a_view = tuple(v for d in a.shape for v in (d, 1))
    b_view = tuple(v for d in b.shape for v in (1, d))
    prod = ew.mul_p.bind(
        _reshape(a, _fill_unknown(a_view)), _reshape(b, _fill_unknown(b_view))
    )
    final = tuple(
        None if p is None or q is None else p * q for p, q in zip(a.shape, b.shape)
    )
    return _reshape(prod, _fill_unknown(final))


def vander(x, N=None, increasing=False):
    x = _t(x)
    if x.ndim != 1:
        raise ValueError(f"vander: x must be 1-D, got shape {x.shape}")
    n = x.shape[0] if N is None else _static_int(N, "N")
    if n is None:
        raise ValueError("vander: N must be given when the length of x is unknown")
    result = standardize_dtype(x.dtype)
    compute = dtypes.result_type(x.dtype, config.floatx())
    xc = _cast(x, compute)
    powers = np.arange(n, dtype=np_dtype(compute))
    if not increasing:
        powers = powers[::-1].copy()
    column = _reshape(xc, _fill_unknown((x.shape[0], 1)))
    out = ew.pow_p.bind(column, powers.reshape(1, n))
    if np_dtype(result).kind in "iu":
        out = ew.round_p.bind(out)
    return _cast(out, result)


def _window(fn, x, *args):
    # NumPy's window functions take any real M (a float M is truncated).
    m = int(_static_number(x, "M"))
    return Tensor(fn(m, *args).astype(np_dtype(config.floatx())))


def bartlett(x):
    return _window(np.bartlett, x)


def blackman(x):
    return _window(np.blackman, x)


def hamming(x):
    return _window(np.hamming, x)


def hanning(x):
    return _window(np.hanning, x)


def kaiser(x, beta):
    return _window(np.kaiser, x, float(_static_number(beta, "beta")))
