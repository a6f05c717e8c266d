"""Sorting and searching of keras.ops.numpy: sort, argsort, argpartition,
searchsorted, digitize, isin. Re-exported by reductions.py."""

import numpy as np

from keras.src.backend.common import dtypes

from keras_ipu.backend import prims as b
from keras_ipu.device.primitives import sort as sort_prims

__all__ = [
    "sort",
    "argsort",
    "argpartition",
    "searchsorted",
    "digitize",
    "isin",
]


def _along(x, axis):
    """(x, axis) with axis=None meaning the flattened tensor."""
    x = b.tensor(x)
    if axis is None:
        return b.flatten(x), 0
    if x.ndim == 0:
        return b.reshape(x, (1,)), 0
    return x, b.axis_of(axis, x.ndim)


def sort(x, axis=-1):
    x, axis = _along(x, axis)
    (out,) = sort_prims.sort_p.bind(x, dimension=axis, num_keys=1)
    return out


def argsort(x, axis=-1):
    x, axis = _along(x, axis)
    index = b.broadcast_like(b.iota_like(x, axis, "int32"), x)
    _, order = sort_prims.sort_p.bind(x, index, dimension=axis, num_keys=1)
    return order


def argpartition(x, kth, axis=-1):
    x, axis = _along(x, axis)
    n = x.shape[axis]
    kths = np.atleast_1d(np.asarray(kth))
    if kths.dtype.kind not in "iu":
        raise ValueError(f"argpartition: kth must be an integer, got {kth!r}")
    if n is not None and np.any((kths >= n) | (kths < -n)):
        raise ValueError(
            f"argpartition: kth={kth} is out of bounds for an axis of length "
            f"{n}; use -{n} <= kth < {n}"
        )
    # A full stable sort is one valid partition (every kth is in place).
    return argsort(x, axis=axis)


def searchsorted(sorted_sequence, values, side="left"):
    sorted_sequence = b.tensor(sorted_sequence)
    values = b.tensor(values)
    if sorted_sequence.ndim != 1:
        raise ValueError(
            "`searchsorted` only supports 1-D sorted sequences. You can use "
            "`keras.ops.vectorized_map` to extend it to N-D sequences. "
            f"Received: sorted_sequence.shape={sorted_sequence.shape}"
        )
    if side not in ("left", "right"):
        raise ValueError(
            f"`side` must be 'left' or 'right', got side={side!r}"
        )
    dtype = dtypes.result_type(b.kdtype(sorted_sequence), b.kdtype(values))
    return sort_prims.searchsorted_p.bind(
        b.cast(sorted_sequence, dtype), b.cast(values, dtype), side=side
    )


def digitize(x, bins):
    x = b.tensor(x)
    bins = b.tensor(bins)
    if bins.ndim != 1:
        raise ValueError(f"digitize: bins must be 1-D, got shape {bins.shape}")
    dtype = dtypes.result_type(b.kdtype(x), b.kdtype(bins))
    x = b.cast(x, dtype)
    bins = b.cast(bins, dtype)
    rising = sort_prims.searchsorted_p.bind(bins, x, side="right")
    if bins.shape[0] is not None and bins.shape[0] < 2:
        return rising
    # Decreasing bins (NumPy allows them) count the edges > x instead.
    # Which order the bins have is known only from their values, so both
    # answers are built and one is selected.
    at_or_below = sort_prims.searchsorted_p.bind(
        b.rev(bins, (0,)), x, side="right"
    )
    falling = b.sub(b.count(bins, (0,), "int32"), at_or_below)
    first = b.slice_axis(bins, 0, 0, 1)
    last = b.slice_axis(bins, 0, -1, None)
    increasing = b.reshape(b.ge(last, first), ())
    return b.where(increasing, rising, falling)


def isin(x1, x2, assume_unique=False, invert=False):
    x1 = b.tensor(x1)
    x2 = b.tensor(x2)
    dtype = dtypes.result_type(b.kdtype(x1), b.kdtype(x2))
    x1 = b.cast(x1, dtype)
    table = b.flatten(b.cast(x2, dtype))
    (table,) = sort_prims.sort_p.bind(table, dimension=0, num_keys=1)
    # x is in the table when some entry equals it: the left and right
    # insertion points differ. NaN equals nothing (NumPy's rule).
    left = sort_prims.searchsorted_p.bind(table, x1, side="left")
    right = sort_prims.searchsorted_p.bind(table, x1, side="right")
    found = b.logical_and(b.lt(left, right), b.logical_not(b.isnan(x1)))
    return b.logical_not(found) if invert else found
