"""Gradient rules of the primitives of primitives/pooling.py (contract:
keras_ipu/device/autodiff/__init__.py), registered when the primitive set
is imported (primitives/__init__.py), after every primitive is declared."""

import numpy as np

from keras_ipu.device.primitives import ad_util
from keras_ipu.device.primitives import elementwise as ew
from keras_ipu.device.primitives.conv import resolve_padding
from keras_ipu.device.primitives.indexing import slice_p
from keras_ipu.device.primitives.pooling import identity
from keras_ipu.device.primitives.pooling import reduce_window_p
from keras_ipu.device.primitives.structure import pad_p


def _reduce_window_grad(cts, inputs, outputs, *, op, window_dimensions,
                        window_strides, padding, base_dilation,
                        window_dilation):
    """One term per window tap: the tap's view of the padded operand is a
    strided slice with the output's shape; its share of the cotangent is
    padded back into place (the slice's transpose) and summed. For max/min
    the first tap holding the extremum of a window takes the cotangent (as
    XLA's select-and-scatter)."""
    (g,), (x,), (y,) = cts, inputs, outputs
    if any(d != 1 for d in base_dilation):
        raise NotImplementedError(
            "The gradient of reduce_window with base_dilation "
            f"{base_dilation} is not implemented yet."
        )
    if any(d is None for d in x.shape):
        raise NotImplementedError(
            "The gradient of reduce_window needs the operand's shape; got "
            f"{x.shape}."
        )
    padding = resolve_padding(padding, x.shape, window_dimensions,
                              window_strides, base_dilation, window_dilation)
    ndim = x.ndim
    config = tuple((lo, hi, 0) for lo, hi in padding)
    # VALID pooling pads nothing: no pad node (a full copy of the operand
    # and of the gradient per step: 2 ms each for the CNN benchmark's
    # 128x32x32x32 on one core, issue 16).
    unpadded = all(lo == 0 and hi == 0 for lo, hi in padding)
    xp = x if unpadded else pad_p.bind(
        x, ad_util.scalar(identity(op, x.dtype), x.dtype), config=config)
    padded = xp.shape
    zero = ad_util.scalar(0, g.dtype)
    acc = None
    taken = None
    for tap in np.ndindex(*window_dimensions):
        starts = tuple(t * d for t, d in zip(tap, window_dilation))
        if any(n == 0 for n in y.shape):
            break
        limits = tuple(s + (n - 1) * st + 1
                       for s, n, st in zip(starts, y.shape, window_strides))
        share = g
        if op != "sum":
            view = slice_p.bind(xp, start_indices=starts,
                                limit_indices=limits,
                                strides=tuple(window_strides))
            hit = ew.eq_p.bind(view, y)
            if taken is not None:
                hit = ew.and_p.bind(hit, ew.logical_not_p.bind(taken))
                taken = ew.or_p.bind(taken, hit)
            else:
                taken = hit
            share = ew.select_p.bind(hit, g, zero)
        back = pad_p.bind(share, zero, config=tuple(
            (s, p - lim, st - 1)
            for s, lim, p, st in zip(starts, limits, padded, window_strides)
        ))
        acc = ad_util.add_any(acc, back)
    if acc is None:
        return [ad_util.zeros_like(x)]
    # Drop the padding (and zero-fill what the padding cropped).
    if unpadded:
        return [acc]
    unpad = tuple((-lo, -hi, 0) for lo, hi, _ in config)
    return [pad_p.bind(acc, zero, config=unpad)]


reduce_window_p.grad = _reduce_window_grad
