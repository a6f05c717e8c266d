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


# -- gradient rules (contract: keras_ipu/device/autodiff.py) -----------------


def _cumsum_grad(cts, inputs, outputs, *, axis, reverse=False):
    (g,) = cts
    return [cumsum_p.bind(g, axis=axis, reverse=not reverse)]


def _cumprod_grad(cts, inputs, outputs, *, axis, reverse=False):
    from keras_ipu.device.primitives import elementwise as ew

    # out_j = prod_{i<=j} x_i: x_i's cotangent is sum_{j>=i} g_j out_j / x_i.
    # Exact for non-zero x (a zero entry gives inf/nan, as the division).
    (g,), (x,), (y,) = cts, inputs, outputs
    acc = cumsum_p.bind(ew.mul_p.bind(g, y), axis=axis, reverse=not reverse)
    return [ew.div_p.bind(acc, x)]


def _cum_extremum_grad(cts, inputs, outputs, *, axis, reverse=False):
    """out_i = x_a(i), a(i) being the last index <= i where x reaches the
    running extremum (x_j == out_j): a = cummax of those indices. Each g_i
    is added at a(i)."""
    from keras_ipu.device.primitives import ad_util
    from keras_ipu.device.primitives import elementwise as ew
    from keras_ipu.device.primitives import structure

    (g,), (x,), (y,) = cts, inputs, outputs
    if x.ndim == 0:
        return [g]
    axis = axis % x.ndim
    if reverse:
        x, y, g = (structure.rev_p.bind(v, axes=(axis,)) for v in (x, y, g))
    last = x.ndim - 1
    perm = tuple(i for i in range(x.ndim) if i != axis) + (axis,)
    x, y, g = (structure.transpose_p.bind(v, permutation=perm)
               for v in (x, y, g))
    iota = structure.iota_p.bind(dtype=np.dtype(np.int32),
                                 shape=tuple(x.shape), dimension=last)
    reached = ew.eq_p.bind(x, y)
    marks = ew.select_p.bind(reached, iota, np.int32(-1))
    where = cummax_p.bind(marks, axis=last)
    ct = ad_util.scatter_add_last_axis(x, where, g)
    ct = structure.transpose_p.bind(
        ct, permutation=tuple(int(i) for i in np.argsort(perm)))
    if reverse:
        ct = structure.rev_p.bind(ct, axes=(axis,))
    return [ct]


cumsum_p.grad = _cumsum_grad
cumprod_p.grad = _cumprod_grad
cummax_p.grad = _cum_extremum_grad
cummin_p.grad = _cum_extremum_grad


# -- cost rules (formulas and constants: keras_ipu/device/simulator/cost_model.py)
from keras_ipu.device.primitives import cost_util as _cost  # noqa: E402

# A parallel prefix scan does about two ops per element (up and down sweep).
for _p in (cumsum_p, cumprod_p, cummax_p, cummin_p):
    _p.cost = _cost.per_output("reduce", lambda ins, outs, **p: 2 * _cost.size(outs[0]))
del _p
