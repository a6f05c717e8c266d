"""Gradient rules of the primitives of primitives/conv.py (contract:
keras_ipu/device/autodiff/__init__.py), registered when the primitive set
is imported (primitives/__init__.py), after every primitive is declared."""

import numpy as np

from keras_ipu.device.primitives import ad_util
from keras_ipu.device.primitives.conv import conv_general_dilated_p
from keras_ipu.device.primitives.conv import resolve_padding
from keras_ipu.device.primitives.dot import dot_general_p
from keras_ipu.device.primitives.indexing import slice_p
from keras_ipu.device.primitives.structure import concatenate_p
from keras_ipu.device.primitives.structure import pad_p
from keras_ipu.device.primitives.structure import rev_p
from keras_ipu.device.primitives.structure import transpose_p


# cotangent, batch and feature axes swapped.


# dilation swapped; the kernel's is the input convolved with the output


# cotangent convolved with the spatially flipped kernel, strides and input


# _conv_general_dilated_transpose_lhs/_rhs): the input's is the output


# Both cotangents are convolutions again (as lax's


def _dilated(n, d):
    return 0 if n == 0 else (n - 1) * d + 1


def _swap01(spec):
    return (spec[1], spec[0]) + tuple(spec[2:])


def _static_dims(shape, spec, what):
    dims = tuple(shape[a] for a in spec)
    if any(d is None for d in dims):
        raise NotImplementedError(
            f"The gradient of conv_general_dilated needs the {what} sizes; "
            f"got shape {shape}."
        )
    return dims


def _spatial_sizes(g, lhs, rhs, dimension_numbers):
    """The (input, kernel, output) spatial sizes, which must be known."""
    lhs_spec, rhs_spec, out_spec = dimension_numbers
    return (_static_dims(lhs.shape, lhs_spec[2:], "input"),
            _static_dims(rhs.shape, rhs_spec[2:], "kernel"),
            _static_dims(g.shape, out_spec[2:], "output"))


def _conv_lhs_grad(g, lhs, rhs, window_strides, padding, lhs_dilation,
                   rhs_dilation, dimension_numbers, groups):
    lhs_spec, rhs_spec, out_spec = dimension_numbers
    nsp = len(lhs_spec) - 2
    in_sp, k_sp, out_sp = _spatial_sizes(g, lhs, rhs, dimension_numbers)
    # The kernel in logical (O, I, *K) layout, re-grouped so the transposed
    # convolution maps each group's O/G output channels back to its I
    # input channels: (G*I, O/G, *K).
    w = transpose_p.bind(rhs, permutation=tuple(rhs_spec))
    o, i = w.shape[0], w.shape[1]
    w = ad_util.reshape(w, (groups, o // groups, i) + k_sp)
    w = transpose_p.bind(w, permutation=(0, 2, 1) + tuple(range(3, 3 + nsp)))
    w = ad_util.reshape(w, (groups * i, o // groups) + k_sp)
    w = rev_p.bind(w, axes=tuple(range(2, 2 + nsp)))
    pads = []
    for n, k, s, p, ld, rd, m in zip(in_sp, k_sp, window_strides, padding,
                                     lhs_dilation, rhs_dilation, out_sp):
        before = _dilated(k, rd) - p[0] - 1
        after = _dilated(n, ld) + _dilated(k, rd) - 1 - _dilated(m, s) - before
        pads.append((before, after))
    logical = tuple(range(nsp + 2))
    return conv_general_dilated_p.bind(
        g, w,
        window_strides=tuple(lhs_dilation),
        padding=tuple(pads),
        lhs_dilation=tuple(window_strides),
        rhs_dilation=tuple(rhs_dilation),
        dimension_numbers=(tuple(out_spec), logical, tuple(lhs_spec)),
        feature_group_count=groups,
    )


def _conv_rhs_grad(g, lhs, rhs, window_strides, padding, lhs_dilation,
                   rhs_dilation, dimension_numbers, groups):
    lhs_spec, rhs_spec, out_spec = dimension_numbers
    nsp = len(lhs_spec) - 2
    in_sp, k_sp, out_sp = _spatial_sizes(g, lhs, rhs, dimension_numbers)
    pads = []
    for n, k, s, p, ld, rd, m in zip(in_sp, k_sp, window_strides, padding,
                                     lhs_dilation, rhs_dilation, out_sp):
        lo = p[0]
        hi = _dilated(m, s) - _dilated(n, ld) + _dilated(k, rd) - lo - 1
        pads.append((lo, hi))
    if groups > 1:
        return _grouped_rhs_grad(g, lhs, rhs, window_strides, padding,
                                 lhs_dilation, rhs_dilation, dimension_numbers,
                                 groups, k_sp, out_sp)
    logical = tuple(range(nsp + 2))
    # Batch is contracted: input channels become the batch and the output
    # cotangent is the kernel; the result is (C, O, *K) in logical layout.
    full = conv_general_dilated_p.bind(
        lhs, g,
        window_strides=tuple(rhs_dilation),
        padding=tuple(pads),
        lhs_dilation=tuple(lhs_dilation),
        rhs_dilation=tuple(window_strides),
        dimension_numbers=(_swap01(lhs_spec), _swap01(out_spec), logical),
        feature_group_count=1,
    )
    full = transpose_p.bind(
        full, permutation=(1, 0) + tuple(range(2, 2 + nsp)))
    # Logical (O, I, *K) into the kernel's layout.
    perm = tuple(int(a) for a in np.argsort(rhs_spec))
    return transpose_p.bind(full, permutation=perm)


def _grouped_rhs_grad(g, lhs, rhs, window_strides, padding, lhs_dilation,
                      rhs_dilation, dimension_numbers, groups, k_sp, out_sp):
    """The kernel cotangent of a grouped convolution, one kernel tap at a
    time: the tap's strided view of the (dilated, padded) input contracted
    with the output cotangent over batch and pixels, batched over groups.
    (A single convolution would need XLA's batch_group_count, or compute
    every channel pair: groups times the work.)"""
    lhs_spec, rhs_spec, out_spec = dimension_numbers
    nsp = len(lhs_spec) - 2
    x = transpose_p.bind(lhs, permutation=tuple(lhs_spec))  # N, C, *S
    gl = transpose_p.bind(g, permutation=tuple(out_spec))  # N, O, *P
    config = ((0, 0, 0), (0, 0, 0)) + tuple(
        (lo, hi, d - 1) for (lo, hi), d in zip(padding, lhs_dilation))
    x = pad_p.bind(x, ad_util.scalar(0, x.dtype), config=config)
    n, c = x.shape[0], x.shape[1]
    o = gl.shape[1]
    i, og = c // groups, o // groups
    x = ad_util.reshape(x, (n, groups, i) + tuple(x.shape[2:]))
    gl = ad_util.reshape(gl, (n, groups, og) + tuple(out_sp))
    spatial = tuple(range(3, 3 + nsp))
    taps = []
    for tap in np.ndindex(*k_sp):
        starts = (0, 0, 0) + tuple(t * d for t, d in zip(tap, rhs_dilation))
        limits = (n, groups, i) + tuple(
            st + (p - 1) * s + 1
            for st, p, s in zip(starts[3:], out_sp, window_strides))
        view = slice_p.bind(x, start_indices=starts, limit_indices=limits,
                            strides=(1, 1, 1) + tuple(window_strides))
        w = dot_general_p.bind(
            view, gl,
            dimension_numbers=(((0,) + spatial, (0,) + spatial),
                               ((1,), (1,))))  # G, I, Og
        taps.append(ad_util.reshape(w, (groups, i, og, 1)))
    w = taps[0] if len(taps) == 1 else concatenate_p.bind(*taps, axis=3)
    w = ad_util.reshape(w, (groups, i, og) + tuple(k_sp))
    # (G, I, Og, *K) -> (G, Og, I, *K) -> logical (O, I, *K) -> kernel layout
    w = transpose_p.bind(w, permutation=(0, 2, 1) + tuple(range(3, 3 + nsp)))
    w = ad_util.reshape(w, (o, i) + tuple(k_sp))
    perm = tuple(int(a) for a in np.argsort(rhs_spec))
    return transpose_p.bind(w, permutation=perm)


def _conv_grad(cts, inputs, outputs, *, window_strides, padding, lhs_dilation,
               rhs_dilation, dimension_numbers, feature_group_count):
    (g,), (lhs, rhs) = cts, inputs
    lhs_spec, rhs_spec, _ = dimension_numbers
    padding = resolve_padding(
        padding, [lhs.shape[a] for a in lhs_spec[2:]],
        [rhs.shape[a] for a in rhs_spec[2:]], window_strides, lhs_dilation,
        rhs_dilation)
    if any(p is None for p in padding):
        raise NotImplementedError(
            "The gradient of a SAME-padded strided convolution needs the "
            f"input size; got input shape {lhs.shape}."
        )
    args = (g, lhs, rhs, window_strides, padding, lhs_dilation, rhs_dilation,
            dimension_numbers, feature_group_count)
    return [_conv_lhs_grad(*args), _conv_rhs_grad(*args)]


conv_general_dilated_p.grad = _conv_grad
