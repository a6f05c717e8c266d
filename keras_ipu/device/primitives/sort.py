"""Sorting primitives: sort (several operands ordered by leading keys),
top_k, searchsorted.

Order: ascending puts NaN last, as NumPy does; descending is the exact
reverse of that order (NaN first), and both are stable (equal keys keep
their original order), so argsort and top_k are reproducible.

Gradient rules: grads/sort.py (registered once every primitive exists).
"""

import numpy as np

from keras_ipu.device.ir import ShapedArray
from keras_ipu.device.primitives import cost_util as _cost
from keras_ipu.device.primitives import shape_rules
from keras_ipu.device.primitives.registry import Primitive


def _sort_rule(*operands, dimension, num_keys=1, descending=False):
    if not operands:
        raise ValueError("sort: needs at least one operand")
    if not 1 <= num_keys <= len(operands):
        raise ValueError(
            f"sort: num_keys={num_keys} must be between 1 and the number of "
            f"operands ({len(operands)})"
        )
    first = operands[0]
    shape_rules.normalize_axis(dimension, first.ndim)
    for op in operands[1:]:
        if op.ndim != first.ndim or any(
            a is not None and b is not None and a != b
            for a, b in zip(op.shape, first.shape)
        ):
            raise shape_rules.ShapeError(
                "sort: every operand must have the shape of the first; got "
                + ", ".join(str(o.shape) for o in operands)
            )
    shape = shape_rules.broadcast_shapes(*(o.shape for o in operands))
    return tuple(ShapedArray(shape, o.dtype) for o in operands)


def _stable_order(keys, axis):
    """Indices that sort `keys` (first key most significant) along axis."""
    if len(keys) == 1:
        return np.argsort(keys[0], axis=axis, kind="stable")
    # lexsort's last key is the primary one.
    return np.lexsort(tuple(reversed(keys)), axis=axis)


def _sort(*operands, dimension, num_keys=1, descending=False):
    operands = [np.asarray(o) for o in operands]
    if operands[0].ndim == 0:
        return tuple(o.copy() for o in operands)
    keys = operands[:num_keys]
    if descending:
        # Stable descending = reverse of a stable ascending sort of the
        # reversed input (equal keys then come out in original order).
        n = keys[0].shape[dimension]
        flipped = [np.flip(k, dimension) for k in keys]
        order = n - 1 - np.flip(_stable_order(flipped, dimension), dimension)
    else:
        order = _stable_order(keys, dimension)
    return tuple(np.take_along_axis(o, order, axis=dimension) for o in operands)


# sort(*operands; dimension, num_keys, descending): every operand reordered
# by the lexicographic order of the first num_keys operands.
sort_p = Primitive("sort", _sort_rule, _sort, multiple_results=True)


def _top_k_rule(x, *, k, index_dtype=np.dtype(np.int32)):
    if x.ndim == 0:
        raise shape_rules.ShapeError("top_k: the operand must have rank >= 1")
    if k < 0:
        raise ValueError(f"top_k: k must be >= 0, got k={k}")
    n = x.shape[-1]
    if n is not None and k > n:
        raise shape_rules.ShapeError(
            f"top_k: k={k} is larger than the last dimension ({n}) of the "
            f"operand {x.shape}; use k <= {n}"
        )
    shape = x.shape[:-1] + (k,)
    return ShapedArray(shape, x.dtype), ShapedArray(shape, index_dtype)


def _top_k(x, *, k, index_dtype=np.dtype(np.int32)):
    x = np.asarray(x)
    n = x.shape[-1]
    values, indices = _sort(
        x,
        np.broadcast_to(np.arange(n), x.shape),
        dimension=x.ndim - 1,
        descending=True,
    )
    return values[..., :k], indices[..., :k].astype(index_dtype)


# top_k(x; k): the k largest entries along the last axis, largest first,
# and their indices (ties: lower index first).
top_k_p = Primitive("top_k", _top_k_rule, _top_k, multiple_results=True)


def _searchsorted_rule(
    sorted_sequence, values, *, side="left", index_dtype=np.dtype(np.int32)
):
    if side not in ("left", "right"):
        raise ValueError(
            f"searchsorted: side must be 'left' or 'right', got side={side!r}"
        )
    if sorted_sequence.ndim != 1:
        raise shape_rules.ShapeError(
            "searchsorted: the sorted sequence must be 1-D, got shape "
            f"{sorted_sequence.shape}; map over the leading axes for N-D"
        )
    if sorted_sequence.dtype != values.dtype:
        raise TypeError(
            f"searchsorted: operands must share one dtype, got "
            f"{sorted_sequence.dtype.name} and {values.dtype.name} (the "
            "backend promotes first)"
        )
    return ShapedArray(values.shape, index_dtype)


def _searchsorted(
    sorted_sequence, values, *, side="left", index_dtype=np.dtype(np.int32)
):
    return np.searchsorted(sorted_sequence, values, side=side).astype(index_dtype)


# searchsorted(sorted_sequence, values; side): insertion indices of values
# into the ascending 1-D sequence (NaN sorts last, as in NumPy).
searchsorted_p = Primitive(
    "searchsorted",
    _searchsorted_rule,
    _searchsorted,
    nondiff="integer output",
)


# -- cost rules (formulas and constants: keras_ipu/device/simulator/cost_model.py)


def _sort_flops(ins, outs, *, dimension, **params):
    # A comparison sort: n log2 n compare-exchanges per sorted row, per operand.
    n = ins[0].shape[dimension] or 0
    return sum(_cost.size(a) for a in ins) * _cost.log2(n)


def _top_k_flops(ins, outs, *, k, **params):
    n = ins[0].shape[-1] or 0
    return _cost.size(ins[0]) * _cost.log2(min(k, n) if n else k)


def _searchsorted_flops(ins, outs, **params):
    # A binary search per value.
    return _cost.size(ins[1]) * _cost.log2(ins[0].shape[-1] or 0)


sort_p.cost = _cost.per_output("sort", _sort_flops)
top_k_p.cost = _cost.per_output("sort", _top_k_flops)
searchsorted_p.cost = _cost.per_output("sort", _searchsorted_flops)
