"""Reductions over axes.

Gradient rules: grads/reduce.py (registered once every primitive exists).
"""

import numpy as np

from keras_ipu.device.ir import ShapedArray
from keras_ipu.device.primitives import cost_util as _cost
from keras_ipu.device.primitives import shape_rules
from keras_ipu.device.primitives.registry import Primitive


def _reduced_shape(x, axes):
    axes = shape_rules.normalize_axes(axes, x.ndim)
    return tuple(d for i, d in enumerate(x.shape) if i not in axes), axes


def _reduce_rule(dtype=None):
    def rule(x, *, axes):
        shape, _ = _reduced_shape(x, axes)
        return ShapedArray(shape, x.dtype if dtype is None else dtype)

    return rule


def _reduction(name, fn, dtype=None, nondiff=None, fp_class=None):
    def kernel(x, *, axes):
        out = fn(x, axis=tuple(axes))
        want = x.dtype if dtype is None else np.dtype(dtype)
        out = np.asarray(out)
        return out if out.dtype == want else out.astype(want)

    kernel.__name__ = name
    return Primitive(name, _reduce_rule(dtype), kernel, nondiff=nondiff,
                     fp_class=fp_class)


# Sums and products accumulate in float32 on the device (numerics.py).
reduce_sum_p = _reduction("reduce_sum", np.sum, fp_class="accumulating")
reduce_prod_p = _reduction("reduce_prod", np.prod, fp_class="accumulating")
reduce_max_p = _reduction("reduce_max", np.max)
reduce_min_p = _reduction("reduce_min", np.min)
reduce_and_p = _reduction("reduce_and", np.all, dtype=bool, nondiff="boolean")
reduce_or_p = _reduction("reduce_or", np.any, dtype=bool, nondiff="boolean")


def _arg_rule(x, *, axis, index_dtype):
    shape, _ = _reduced_shape(x, (axis,))
    return ShapedArray(shape, index_dtype)


def _argmax(x, *, axis, index_dtype):
    return np.argmax(x, axis=axis).astype(index_dtype)


def _argmin(x, *, axis, index_dtype):
    return np.argmin(x, axis=axis).astype(index_dtype)


argmax_p = Primitive("argmax", _arg_rule, _argmax, nondiff="integer output")
argmin_p = Primitive("argmin", _arg_rule, _argmin, nondiff="integer output")


def _bincount_rule(x, weights, *, minlength):
    if x.dtype.kind not in "iub":
        raise TypeError(f"bincount: values must be integers, got {x.short()}")
    if x.ndim not in (1, 2):
        raise shape_rules.ShapeError(
            f"bincount: values must be 1-D (or 2-D: one count per row), got "
            f"shape {x.shape}"
        )
    if weights.ndim != x.ndim:
        raise shape_rules.ShapeError(
            f"bincount: weights {weights.shape} must have the shape of the "
            f"values {x.shape}"
        )
    # The length is max(values) + 1: known only from the values.
    return ShapedArray(x.shape[:-1] + (None,), weights.dtype)


def _bincount(x, weights, *, minlength):
    x = np.asarray(x).astype(np.int64)
    if x.size and x.min() < 0:
        raise ValueError(
            f"bincount: values must be non-negative, got a minimum of "
            f"{x.min()}"
        )
    length = max(int(minlength), int(x.max()) + 1 if x.size else 0)
    rows = x.reshape(-1, x.shape[-1]) if x.ndim else x.reshape(1, 1)
    flat = (rows + length * np.arange(rows.shape[0])[:, None]).ravel()
    w = np.broadcast_to(weights, x.shape).reshape(-1)
    if weights.dtype.kind == "c":
        counts = np.bincount(flat, w.real, rows.shape[0] * length) + 1j * (
            np.bincount(flat, w.imag, rows.shape[0] * length)
        )
    else:
        counts = np.bincount(flat, w.astype(np.float64), rows.shape[0] * length)
    out = counts.reshape(x.shape[:-1] + (length,))
    return out.astype(weights.dtype)


# bincount(x, weights; minlength): per row, the sum of weights of each value
# 0..max(x). Its length depends on the values, so it is eager-only.
bincount_p = Primitive(
    "bincount",
    _bincount_rule,
    _bincount,
    dynamic_shape=True,
    nondiff=(
        "value-dependent output length: eager only, so never traced or "
        "differentiated"
    ),
)


def _static_bincount_rule(x, weights, *, length):
    _bincount_rule(x, weights, minlength=length)
    return ShapedArray(x.shape[:-1] + (length,), weights.dtype)


def _static_bincount(x, weights, *, length):
    x = np.asarray(x)
    if x.size and (x.min() < 0 or x.max() >= length):
        bad = int(x.max()) if x.max() >= length else int(x.min())
        raise ValueError(
            f"bincount in a compiled program counts the values 0..{length - 1} "
            f"(its static length is minlength={length}), but the value {bad} "
            "appeared. Pass a minlength larger than every value, or call "
            "bincount eagerly (outside the compiled function)."
        )
    return _bincount(x, weights, minlength=length)


# bincount with the static length `length` (a compiled program's bincount,
# from minlength): values outside 0..length-1 fail at run time instead of
# changing the output's shape.
static_bincount_p = Primitive("static_bincount", _static_bincount_rule, _static_bincount)


# -- cost rules (formulas and constants: keras_ipu/device/simulator/cost_model.py)

for _p in (reduce_sum_p, reduce_prod_p, reduce_max_p, reduce_min_p, reduce_and_p,
           reduce_or_p, bincount_p, static_bincount_p):
    _p.cost = _cost.reduction(1)
# Compare and select the index: two ops per element.
argmax_p.cost = _cost.reduction(2)
argmin_p.cost = _cost.reduction(2)
del _p
