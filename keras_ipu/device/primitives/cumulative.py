"""Cumulative (scan) reductions along one axis: cumsum, cumprod, cummax,
cummin, as jax.lax has them. `reverse=True` accumulates from the end.

Gradient rules: grads/cumulative.py (registered once every primitive exists).
"""

import numpy as np

from keras_ipu.device.ir import ShapedArray
from keras_ipu.device.primitives import cost_util as _cost
from keras_ipu.device.primitives import shape_rules
from keras_ipu.device.primitives.registry import Primitive


def _cumulative_rule(x, *, axis, reverse=False):
    shape_rules.normalize_axis(axis, x.ndim)
    return ShapedArray(x.shape, x.dtype)


def _cumulative(name, ufunc, fp_class=None):
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
    return Primitive(name, _cumulative_rule, kernel, fp_class=fp_class)


# Running sums and products accumulate in float32 on the device.
cumsum_p = _cumulative("cumsum", np.add, fp_class="accumulating")
cumprod_p = _cumulative("cumprod", np.multiply, fp_class="accumulating")
cummax_p = _cumulative("cummax", np.maximum)
cummin_p = _cumulative("cummin", np.minimum)


# -- cost rules (formulas and constants: keras_ipu/device/simulator/cost_model.py)

# A parallel prefix scan does about two ops per element (up and down sweep).
for _p in (cumsum_p, cumprod_p, cummax_p, cummin_p):
    _p.cost = _cost.per_output("reduce", lambda ins, outs, **p: 2 * _cost.size(outs[0]))
del _p
