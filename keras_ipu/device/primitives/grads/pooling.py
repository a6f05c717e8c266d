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
from keras_ipu.device.primitives.pooling import select_and_scatter_add_p
from keras_ipu.device.primitives.structure import pad_p


def _pad_for_windows(x, op, padding):
    """x padded (lo, hi) with op's identity; x itself when nothing is
    padded (VALID pooling: no copy of the operand per step, issue 16)."""
    if all(lo == 0 and hi == 0 for lo, hi in padding):
        return x
    return pad_p.bind(x, ad_util.scalar(identity(op, x.dtype), x.dtype),
                      config=tuple((lo, hi, 0) for lo, hi in padding))


def _tap_limits(starts, out_shape, window_strides):
    return tuple(s + (n - 1) * st + 1
                 for s, n, st in zip(starts, out_shape, window_strides))


def _reduce_window_grad(cts, inputs, outputs, *, op, window_dimensions,
                        window_strides, padding, base_dilation,
                        window_dilation):
    """max/min: select_and_scatter_add (the first tap holding the extremum
    of a window takes the cotangent, as XLA's select-and-scatter and
    TensorFlow's MaxPoolGrad). sum: one term per window tap, the tap's
    share of the cotangent padded back into place (the transpose of its
    strided view of the padded operand) and summed."""
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
    if op != "sum":
        return [select_and_scatter_add_p.bind(
            g, x, y, op=op, window_dimensions=tuple(window_dimensions),
            window_strides=tuple(window_strides), padding=tuple(padding),
            window_dilation=tuple(window_dilation))]
    padded = tuple(n + lo + hi for n, (lo, hi) in zip(x.shape, padding))
    zero = ad_util.scalar(0, g.dtype)
    acc = None
    if all(n > 0 for n in y.shape):
        for tap in np.ndindex(*window_dimensions):
            starts = tuple(t * d for t, d in zip(tap, window_dilation))
            limits = _tap_limits(starts, y.shape, window_strides)
            back = pad_p.bind(g, zero, config=tuple(
                (s, p - lim, st - 1)
                for s, lim, p, st in zip(starts, limits, padded, window_strides)
            ))
            acc = ad_util.add_any(acc, back)
    if acc is None:
        return [ad_util.zeros_like(x)]
    # Drop the padding (and zero-fill what the padding cropped).
    if all(lo == 0 and hi == 0 for lo, hi in padding):
        return [acc]
    return [pad_p.bind(acc, zero, config=tuple((-lo, -hi, 0) for lo, hi in padding))]


def _select_and_scatter_add_grad(cts, inputs, outputs, *, op, window_dimensions,
                                 window_strides, padding, window_dilation):
    """Linear in the cotangent g: each window reads the cotangent back
    from the element its first extremum is (a select per tap); the
    operand and window results only choose where (no cotangent)."""
    (ct,), (g, x, y) = cts, inputs
    if ct is None:
        return [None, None, None]
    xp = _pad_for_windows(x, op, padding)
    ctp = _pad_for_windows(ct, "sum", padding)
    picked = ad_util.zeros_like(g)
    taken = None
    for tap in np.ndindex(*window_dimensions):
        starts = tuple(t * d for t, d in zip(tap, window_dilation))
        limits = _tap_limits(starts, y.shape, window_strides)
        strides = tuple(window_strides)
        hit = ew.eq_p.bind(slice_p.bind(xp, start_indices=starts, limit_indices=limits,
                                        strides=strides), y)
        if taken is not None:
            hit = ew.and_p.bind(hit, ew.logical_not_p.bind(taken))
            taken = ew.or_p.bind(taken, hit)
        else:
            taken = hit
        picked = ew.select_p.bind(hit, slice_p.bind(ctp, start_indices=starts,
                                                    limit_indices=limits,
                                                    strides=strides), picked)
    return [picked, None, None]


reduce_window_p.grad = _reduce_window_grad
select_and_scatter_add_p.grad = _select_and_scatter_add_grad
