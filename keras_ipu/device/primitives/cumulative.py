"""Cumulative (scan) reductions along one axis: cumsum, cumprod, cummax,
cummin, as jax.lax has them. `reverse=True` accumulates from the end."""

import numpy as np

from keras_ipu.device.ir import ShapedArray
from keras_ipu.device.primitives import shape_rules
from keras_ipu.device.primitives.registry import Primitive


def _cumulative_rule(x, *, axis, reverse=False):
    shape_rules.normalize_axis(axis, x.ndim)
    return ShapedArray(x.shape, x.dtype)


def _cumulative(name, ufunc):
    def kernel(x, *, axis, reverse=False):
        x = np.asarray(x)
        if x.ndim == 0:
            return x.copy()
        if reverse:
            x = np.flip(x, axis)
        # dtype=x.dtype: NumPy would widen small ints; the device keeps the
        # operand dtype (the backend widens first where Keras wants it).
        out = ufunc.accumulate(x, axis=axis, dtype=x.dtype)
        return np.flip(out, axis) if reverse else out

    kernel.__name__ = name
    return Primitive(name, _cumulative_rule, kernel)


cumsum_p = _cumulative("cumsum", np.add)
cumprod_p = _cumulative("cumprod", np.multiply)
cummax_p = _cumulative("cummax", np.maximum)
cummin_p = _cumulative("cummin", np.minimum)
