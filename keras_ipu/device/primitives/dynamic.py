"""Primitives whose output shape depends on input values: nonzero, unique,
boolean-mask selection.

They run eagerly on the host only (`dynamic_shape=True`); IPU programs have
static shapes. `unique_sized` is the static-shape variant (a fixed `size`,
padded or truncated) and can be traced.
"""

import numpy as np

from keras_ipu.device.ir import ShapedArray
from keras_ipu.device.primitives import shape_rules
from keras_ipu.device.primitives.registry import Primitive

_NONDIFF = "integer indices / value-dependent selection"


def _nonzero_rule(x, *, index_dtype):
    return tuple(ShapedArray((None,), index_dtype) for _ in range(max(x.ndim, 1)))


def _nonzero(x, *, index_dtype):
    return tuple(i.astype(index_dtype) for i in np.nonzero(np.atleast_1d(x)))


# nonzero(x; index_dtype): one index vector per dimension, as np.nonzero.
nonzero_p = Primitive(
    "nonzero",
    _nonzero_rule,
    _nonzero,
    multiple_results=True,
    dynamic_shape=True,
    nondiff=_NONDIFF,
)


def _masked_select_rule(x, mask):
    if mask.dtype != np.dtype(bool):
        raise TypeError(f"masked_select: the mask must be bool, got {mask.short()}")
    k = mask.ndim
    if k > x.ndim or any(
        a is not None and b is not None and a != b
        for a, b in zip(mask.shape, x.shape[:k])
    ):
        raise shape_rules.ShapeError(
            f"masked_select: the mask shape {mask.shape} must match the "
            f"leading dimensions of the operand {x.shape}"
        )
    return ShapedArray((None,) + x.shape[k:], x.dtype)


def _masked_select(x, mask):
    return x[mask]


# masked_select(x, mask): x[mask] for a bool mask over x's leading axes.
masked_select_p = Primitive(
    "masked_select", _masked_select_rule, _masked_select, dynamic_shape=True
)


def _unique_shapes(x, axis, size, index_dtype):
    n = size
    if axis is None:
        values = (n,)
        inverse = x.shape
    else:
        axis = shape_rules.normalize_axis(axis, x.ndim)
        values = x.shape[:axis] + (n,) + x.shape[axis + 1 :]
        inverse = (x.shape[axis],)
    return (
        ShapedArray(values, x.dtype),
        ShapedArray((n,), index_dtype),
        ShapedArray(inverse, index_dtype),
        ShapedArray((n,), index_dtype),
    )


def _unique_rule(x, *, axis, index_dtype):
    return _unique_shapes(x, axis, None, index_dtype)


def _unique(x, *, axis, index_dtype):
    values, index, inverse, counts = np.unique(
        x,
        return_index=True,
        return_inverse=True,
        return_counts=True,
        axis=axis,
        equal_nan=False,
    )
    if axis is None:
        inverse = inverse.reshape(x.shape)
    else:
        inverse = inverse.reshape(-1)
    return (
        values,
        index.astype(index_dtype),
        inverse.astype(index_dtype),
        counts.astype(index_dtype),
    )


# unique(x; axis, index_dtype) -> (values, first index, inverse, counts),
# values sorted; NaNs are not merged (NumPy's equal_nan=False).
unique_p = Primitive(
    "unique",
    _unique_rule,
    _unique,
    multiple_results=True,
    dynamic_shape=True,
    nondiff=_NONDIFF,
)


def _unique_sized_rule(x, *, axis, index_dtype, size, fill_value):
    return _unique_shapes(x, axis, size, index_dtype)


def _fit(a, axis, size, fill):
    """Truncate or pad `a` along `axis` to `size`."""
    n = a.shape[axis]
    if n >= size:
        return np.take(a, np.arange(size), axis=axis)
    pad_shape = list(a.shape)
    pad_shape[axis] = size - n
    return np.concatenate([a, np.full(pad_shape, fill, dtype=a.dtype)], axis=axis)


def _unique_sized(x, *, axis, index_dtype, size, fill_value):
    values, index, inverse, counts = _unique(x, axis=axis, index_dtype=index_dtype)
    if fill_value is None:
        # As jnp.unique: pad with the smallest unique value.
        fill_value = values.min() if values.size else 0
    first = index[0] if index.size else 0
    values = _fit(values, 0 if axis is None else axis, size, fill_value)
    return values, _fit(index, 0, size, first), inverse, _fit(counts, 0, size, 0)


# unique_sized: unique with a fixed number of outputs `size` (padded with
# fill_value / the first index / zero counts, or truncated): a static shape.
unique_sized_p = Primitive(
    "unique_sized",
    _unique_sized_rule,
    _unique_sized,
    multiple_results=True,
    nondiff=_NONDIFF,
)

# masked_select is differentiable in principle, but its output shape depends
# on the mask's values: it never runs traced, and autodiff always traces.
masked_select_p.nondiff = (
    "value-dependent output shape: eager only, so never traced or "
    "differentiated (use where/select for a differentiable mask)"
)


# -- cost rules (formulas and constants: keras_ipu/device/simulator/cost_model.py)
from keras_ipu.device.primitives import cost_util as _cost  # noqa: E402

# Value-dependent output shapes never compile for the IPU: host ops. The
# sized variant of unique is a sort plus a compaction.
nonzero_p.cost = _cost.host
masked_select_p.cost = _cost.host
unique_p.cost = _cost.host
unique_sized_p.cost = _cost.per_output(
    "sort", lambda ins, outs, **p: _cost.size(ins[0]) * _cost.log2(_cost.size(ins[0]))
)
