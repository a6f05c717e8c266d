"""Primitives that select or place parts of arrays (like jax.lax):
static slice, dynamic slice/update, gather, scatter.

Index conventions shared by gather and scatter: `indices` has shape
`batch + (k,)`; row `indices[b]` addresses the first k axes of the operand
(the remaining axes are taken whole). Negative indices count from the end,
as in NumPy (and as JAX's `.at[]` does). The backend moves the indexed axes
to the front (transpose) before it binds, so one layout serves take,
take_along_axis, advanced indexing and every scatter.

Gradient rules: grads/indexing.py (registered once every primitive exists).
"""

import numpy as np

from keras_ipu.device.ir import ShapedArray
from keras_ipu.device.primitives import cost_util as _cost
from keras_ipu.device.primitives import shape_rules
from keras_ipu.device.primitives.registry import Primitive


# ---------------------------------------------------------------- slice


def _resolve_slice(dim, start, limit, stride):
    """Output length of one sliced dimension (None if unknown)."""
    if stride < 1:
        raise shape_rules.ShapeError(
            f"slice: strides must be >= 1, got {stride}. Reverse the axis "
            "(rev) first for a negative step."
        )
    if dim is None:
        return None
    start, limit, _ = slice(start, limit, stride).indices(dim)
    return max(0, -(-(limit - start) // stride))


def _slice_rule(x, *, start_indices, limit_indices, strides):
    if not len(start_indices) == len(limit_indices) == len(strides) == x.ndim:
        raise shape_rules.ShapeError(
            f"slice: start_indices {start_indices}, limit_indices "
            f"{limit_indices} and strides {strides} need one entry per "
            f"dimension of the operand {x.shape}"
        )
    shape = tuple(
        _resolve_slice(d, s, l, st)
        for d, s, l, st in zip(x.shape, start_indices, limit_indices, strides)
    )
    return ShapedArray(shape, x.dtype)


def _slice(x, *, start_indices, limit_indices, strides):
    key = tuple(
        slice(s, l, st)
        for s, l, st in zip(start_indices, limit_indices, strides)
    )
    return x[key]


# Per dimension, start/limit follow Python slice rules (negative counts from
# the end, None is the end, out of range clamps) so that a slice of a
# dimension unknown at trace time (None) can still be written down; strides
# are >= 1 as in lax.slice.
slice_p = Primitive("slice", _slice_rule, _slice)


# --------------------------------------------------------- dynamic slice


def _check_starts(x, starts, name):
    if len(starts) != x.ndim:
        raise shape_rules.ShapeError(
            f"{name}: got {len(starts)} start indices for an operand of rank "
            f"{x.ndim}; pass one scalar start per dimension"
        )
    for s in starts:
        if s.ndim != 0 or s.dtype.kind not in "iu":
            raise TypeError(
                f"{name}: start indices must be integer scalars, got "
                f"{s.short()}"
            )


def _dynamic_slice_rule(x, *starts, slice_sizes):
    _check_starts(x, starts, "dynamic_slice")
    if len(slice_sizes) != x.ndim:
        raise shape_rules.ShapeError(
            f"dynamic_slice: slice_sizes {slice_sizes} must have one entry "
            f"per dimension of the operand {x.shape}"
        )
    for d, s in zip(x.shape, slice_sizes):
        if s < 0 or (d is not None and s > d):
            raise shape_rules.ShapeError(
                f"dynamic_slice: slice_sizes {slice_sizes} do not fit in the "
                f"operand shape {x.shape}"
            )
    return ShapedArray(tuple(slice_sizes), x.dtype)


def _clamped_starts(shape, sizes, starts):
    # XLA clamps so the window stays inside the operand.
    return tuple(
        int(min(max(int(s), 0), d - n)) for d, n, s in zip(shape, sizes, starts)
    )


def _dynamic_slice(x, *starts, slice_sizes):
    starts = _clamped_starts(x.shape, slice_sizes, starts)
    return x[tuple(slice(s, s + n) for s, n in zip(starts, slice_sizes))]


dynamic_slice_p = Primitive("dynamic_slice", _dynamic_slice_rule, _dynamic_slice)


def _dynamic_update_slice_rule(x, update, *starts):
    _check_starts(x, starts, "dynamic_update_slice")
    if update.ndim != x.ndim or update.dtype != x.dtype:
        raise shape_rules.ShapeError(
            f"dynamic_update_slice: the update {update.short()} must have the "
            f"rank and dtype of the operand {x.short()}"
        )
    for d, u in zip(x.shape, update.shape):
        if d is not None and u is not None and u > d:
            raise shape_rules.ShapeError(
                f"dynamic_update_slice: the update {update.shape} is larger "
                f"than the operand {x.shape}"
            )
    return ShapedArray(x.shape, x.dtype)


def _dynamic_update_slice(x, update, *starts):
    starts = _clamped_starts(x.shape, update.shape, starts)
    out = np.array(x, copy=True)
    out[tuple(slice(s, s + n) for s, n in zip(starts, update.shape))] = (
        update
    )
    return out


dynamic_update_slice_p = Primitive(
    "dynamic_update_slice", _dynamic_update_slice_rule, _dynamic_update_slice
)


# ---------------------------------------------------------------- gather


def _index_depth(x, indices, batch_dims, name):
    if indices.dtype.kind not in "iu":
        raise TypeError(f"{name}: indices must be integers, got {indices.short()}")
    if indices.ndim < 1 or indices.shape[-1] is None:
        raise shape_rules.ShapeError(
            f"{name}: indices {indices.short()} need a known last dimension "
            "(the number of indexed axes)"
        )
    k = indices.shape[-1]
    if batch_dims < 0 or batch_dims + k > x.ndim or batch_dims > indices.ndim - 1:
        raise shape_rules.ShapeError(
            f"{name}: indices {indices.shape} with batch_dims={batch_dims} "
            f"address {k} axes but the operand {x.shape} has rank {x.ndim}"
        )
    for a, b in zip(x.shape[:batch_dims], indices.shape[:batch_dims]):
        if a is not None and b is not None and a != b:
            raise shape_rules.ShapeError(
                f"{name}: the batch dimensions of the operand {x.shape} and "
                f"the indices {indices.shape} differ (batch_dims={batch_dims})"
            )
    return k


def _batch(x_shape, idx_shape, batch_dims):
    return tuple(
        a if a is not None else b
        for a, b in zip(x_shape[:batch_dims], idx_shape[:batch_dims])
    )


def _gather_rule(x, indices, *, mode, fill_value=None, batch_dims=0):
    if mode not in ("clip", "fill"):
        raise ValueError(f"gather: mode must be 'clip' or 'fill', got {mode!r}")
    k = _index_depth(x, indices, batch_dims, "gather")
    shape = (
        _batch(x.shape, indices.shape, batch_dims)
        + indices.shape[batch_dims:-1]
        + x.shape[batch_dims + k :]
    )
    return ShapedArray(shape, x.dtype)


def _wrap_negative(idx, dims):
    dims = np.asarray(dims, dtype=np.int64)
    idx = idx.astype(np.int64)
    return np.where(idx < 0, idx + dims, idx)


def _full_key(x_shape, idx, batch_dims):
    """The NumPy advanced-indexing key for `idx` (shape B + I + (k,)):
    an arange per batch axis, then one index array per addressed axis."""
    inner = idx.ndim - 1 - batch_dims
    key = []
    for j in range(batch_dims):
        view = [1] * (batch_dims + inner)
        view[j] = x_shape[j]
        key.append(np.arange(x_shape[j]).reshape(view))
    key.extend(idx[..., j] for j in range(idx.shape[-1]))
    return tuple(key)


def _gather(x, indices, *, mode, fill_value=None, batch_dims=0):
    k = indices.shape[-1]
    dims = np.asarray(x.shape[batch_dims : batch_dims + k], dtype=np.int64)
    idx = _wrap_negative(indices, dims)
    valid = np.all((idx >= 0) & (idx < dims), axis=-1)
    out_shape = indices.shape[:-1] + x.shape[batch_dims + k :]
    if 0 in dims:
        out = np.empty(out_shape, x.dtype)
        out[...] = default_fill(x.dtype) if fill_value is None else fill_value
        return out
    idx = np.clip(idx, 0, dims - 1)
    out = x[_full_key(x.shape, idx, batch_dims)]
    if mode == "fill" and not valid.all():
        fill = default_fill(x.dtype) if fill_value is None else fill_value
        mask = valid.reshape(valid.shape + (1,) * (out.ndim - valid.ndim))
        out = np.where(mask, out, np.asarray(fill).astype(x.dtype))
    return out


def default_fill(dtype):
    """The value of an out-of-bounds gather with mode "fill" and no
    fill_value, as jnp.take(mode="fill"): NaN where the dtype has one, True
    for booleans, else the integer extreme (min signed, max unsigned)."""
    if dtype.kind in "fc":
        return np.nan
    if dtype.kind == "b":
        return True
    if dtype.kind == "i":
        return np.iinfo(dtype).min
    return np.iinfo(dtype).max


# gather(x, indices; mode, fill_value, batch_dims): with x of shape B + X and
# indices of shape B + I + (k,),
#   out[b, i, ...] = x[b, indices[b, i, 0], ..., indices[b, i, k-1], ...]
# mode="clip" clamps out-of-range rows, "fill" gives fill_value for them.
gather_p = Primitive("gather", _gather_rule, _gather)


# --------------------------------------------------------------- scatter

_SCATTER_UFUNCS = {
    "add": np.add,
    "mul": np.multiply,
    "min": np.minimum,
    "max": np.maximum,
}


def _scatter_rule(x, indices, updates, *, mode, batch_dims=0):
    if mode not in ("update",) + tuple(_SCATTER_UFUNCS):
        raise ValueError(
            f"scatter: mode must be one of 'update', 'add', 'mul', 'min', "
            f"'max'; got {mode!r}"
        )
    k = _index_depth(x, indices, batch_dims, "scatter")
    if updates.dtype != x.dtype:
        raise TypeError(
            f"scatter: updates {updates.short()} must have the operand dtype "
            f"{x.dtype.name} (the backend casts first)"
        )
    want = (
        _batch(x.shape, indices.shape, batch_dims)
        + indices.shape[batch_dims:-1]
        + x.shape[batch_dims + k :]
    )
    if len(want) != updates.ndim or any(
        a is not None and b is not None and a != b
        for a, b in zip(want, updates.shape)
    ):
        raise shape_rules.ShapeError(
            f"scatter: updates have shape {updates.shape}; indices "
            f"{indices.shape} into an operand {x.shape} need updates of shape "
            f"{want}"
        )
    return ShapedArray(x.shape, x.dtype)


def _scatter(x, indices, updates, *, mode, batch_dims=0):
    k = indices.shape[-1]
    dims = np.asarray(x.shape[batch_dims : batch_dims + k], dtype=np.int64)
    idx = _wrap_negative(indices, dims)
    # Out-of-range rows are dropped, as XLA's scatter does.
    valid = np.all((idx >= 0) & (idx < dims), axis=-1)
    key = _full_key(x.shape, idx, batch_dims)
    key = tuple(np.broadcast_to(a, valid.shape)[valid] for a in key)
    upd = np.asarray(updates)[valid]
    out = np.array(x, copy=True)
    if mode == "update":
        out[key] = upd
    else:
        _SCATTER_UFUNCS[mode].at(out, key, upd)
    return out


# scatter(x, indices, updates; mode, batch_dims): x with the rows addressed
# as in gather replaced by (mode="update") or combined with (add/mul/min/max)
# updates; duplicates combine (for "update" the last one wins).
scatter_p = Primitive("scatter", _scatter_rule, _scatter)


# -- cost rules (formulas and constants: keras_ipu/device/simulator/cost_model.py)

slice_p.cost = _cost.copy
dynamic_slice_p.cost = _cost.copy
# In-place updates write (and, for a scatter-add, combine) the update only.
dynamic_update_slice_p.cost = _cost.update(1)
gather_p.cost = _cost.copy
scatter_p.cost = _cost.update(2)
