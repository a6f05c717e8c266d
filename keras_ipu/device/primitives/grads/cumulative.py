"""Gradient rules of the primitives of primitives/cumulative.py (contract:
keras_ipu/device/autodiff/__init__.py), registered when the primitive set
is imported (primitives/__init__.py), after every primitive is declared."""

import numpy as np

from keras_ipu.device.primitives import ad_util
from keras_ipu.device.primitives import elementwise as ew
from keras_ipu.device.primitives import structure
from keras_ipu.device.primitives.cumulative import cummax_p
from keras_ipu.device.primitives.cumulative import cummin_p
from keras_ipu.device.primitives.cumulative import cumprod_p
from keras_ipu.device.primitives.cumulative import cumsum_p


def _cumsum_grad(cts, inputs, outputs, *, axis, reverse=False):
    (g,) = cts
    return [cumsum_p.bind(g, axis=axis, reverse=not reverse)]


def _cumprod_grad(cts, inputs, outputs, *, axis, reverse=False):
    # out_j = prod_{i<=j} x_i: x_i's cotangent is sum_{j>=i} g_j out_j / x_i.
    # Exact for non-zero x (a zero entry gives inf/nan, as the division).
    (g,), (x,), (y,) = cts, inputs, outputs
    acc = cumsum_p.bind(ew.mul_p.bind(g, y), axis=axis, reverse=not reverse)
    return [ew.div_p.bind(acc, x)]


def _cum_extremum_grad(cts, inputs, outputs, *, axis, reverse=False):
    """out_i = x_a(i), a(i) being the last index <= i where x reaches the
    running extremum (x_j == out_j): a = cummax of those indices. Each g_i
    is added at a(i)."""
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
