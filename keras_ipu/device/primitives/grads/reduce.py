"""Gradient rules of the primitives of primitives/reduce.py (contract:
keras_ipu/device/autodiff/__init__.py), registered when the primitive set
is imported (primitives/__init__.py), after every primitive is declared."""

import numpy as np

from keras_ipu.device.primitives import ad_util
from keras_ipu.device.primitives import cumulative
from keras_ipu.device.primitives import elementwise as ew
from keras_ipu.device.primitives import shape_rules
from keras_ipu.device.primitives import structure
from keras_ipu.device.primitives.indexing import gather_p
from keras_ipu.device.primitives.reduce import reduce_max_p
from keras_ipu.device.primitives.reduce import reduce_min_p
from keras_ipu.device.primitives.reduce import reduce_prod_p
from keras_ipu.device.primitives.reduce import reduce_sum_p
from keras_ipu.device.primitives.reduce import static_bincount_p
from keras_ipu.device.primitives.structure import reshape_p


def _reduce_sum_grad(cts, inputs, outputs, *, axes):
    (g,), (x,) = cts, inputs
    axes = shape_rules.normalize_axes(axes, x.ndim)
    return [ad_util.broadcast_back(g, x, axes)]


def _reduce_extremum_grad(cts, inputs, outputs, *, axes):
    # The cotangent is shared equally among the entries equal to the
    # extremum (ties split it, as JAX does).
    (g,), (x,), (y,) = cts, inputs, outputs
    axes = shape_rules.normalize_axes(axes, x.ndim)
    y_full = ad_util.broadcast_back(y, x, axes)
    hit = ad_util.convert(ew.eq_p.bind(x, y_full), g.dtype)
    count = reduce_sum_p.bind(hit, axes=axes)
    share = ew.div_p.bind(g, count)
    return [ew.mul_p.bind(hit, ad_util.broadcast_back(share, x, axes))]


def _reduce_prod_grad(cts, inputs, outputs, *, axes):
    # d prod / d x_i = product of the other entries: computed with an
    # exclusive prefix and suffix product, so zeros in x are exact.
    (g,), (x,) = cts, inputs
    axes = shape_rules.normalize_axes(axes, x.ndim)
    keep = tuple(i for i in range(x.ndim) if i not in axes)
    perm = keep + axes
    xt = structure.transpose_p.bind(x, permutation=perm)
    lead = tuple(xt.shape[: len(keep)])
    n = shape_rules.mul_dims(xt.shape[len(keep):])
    flat = ad_util.reshape(xt, lead + (n,))
    axis = flat.ndim - 1
    one = ad_util.scalar(1, flat.dtype)
    pad_lo = ((0, 0, 0),) * axis + ((1, -1, 0),)
    pad_hi = ((0, 0, 0),) * axis + ((-1, 1, 0),)
    before = structure.pad_p.bind(
        cumulative.cumprod_p.bind(flat, axis=axis), one, config=pad_lo)
    after = structure.pad_p.bind(
        cumulative.cumprod_p.bind(flat, axis=axis, reverse=True), one,
        config=pad_hi)
    others = ew.mul_p.bind(before, after)
    others = ad_util.reshape(others, xt.shape)
    inv = tuple(int(i) for i in np.argsort(perm))
    others = structure.transpose_p.bind(others, permutation=inv)
    return [ew.mul_p.bind(ad_util.broadcast_back(g, x, axes), others)]


reduce_sum_p.grad = _reduce_sum_grad
reduce_max_p.grad = _reduce_extremum_grad
reduce_min_p.grad = _reduce_extremum_grad
reduce_prod_p.grad = _reduce_prod_grad


def _static_bincount_grad(cts, inputs, outputs, *, length):
    # counts[..., k] = sum of weights where x == k: the weights' cotangent
    # reads the count's cotangent at each value.

    (ct,), (x, _) = cts, inputs
    index = reshape_p.bind(x, new_shape=tuple(x.shape) + (1,))
    return [None, gather_p.bind(ct, index, mode="clip", batch_dims=x.ndim - 1)]


static_bincount_p.grad = _static_bincount_grad
