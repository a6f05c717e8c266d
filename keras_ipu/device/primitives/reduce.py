"""Reductions over axes."""

import numpy as np

from keras_ipu.device.ir import ShapedArray
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


def _reduction(name, fn, dtype=None, nondiff=None):
    def kernel(x, *, axes):
        out = fn(x, axis=tuple(axes))
        want = x.dtype if dtype is None else np.dtype(dtype)
        out = np.asarray(out)
        return out if out.dtype == want else out.astype(want)

    kernel.__name__ = name
    return Primitive(name, _reduce_rule(dtype), kernel, nondiff=nondiff)


reduce_sum_p = _reduction("reduce_sum", np.sum)
reduce_prod_p = _reduction("reduce_prod", np.prod)
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
