"""Patch extraction and pixel shuffles: unfold (im2col), fold (col2im),
depth_to_space, space_to_depth.

unfold is a gather with a static index; fold, its adjoint (a sum of
overlapping blocks), is the transposed convolution with an identity kernel
(one input channel per kernel tap) on the conv_general_dilated primitive.
"""

import numpy as np

from keras_ipu.backend.nn_ops import _lax as lax
from keras_ipu.device.primitives.conv import conv_general_dilated

__all__ = ["unfold", "fold", "depth_to_space", "space_to_depth"]


def _pair(value, name):
    if isinstance(value, int):
        return (value, value)
    value = tuple(int(v) for v in value)
    if len(value) != 2:
        raise ValueError(f"`{name}` must be an int or a pair; got {value}.")
    return value


def _block_args(kernel_size, dilation, padding, stride):
    """The (h, w) pairs of the sliding-block arguments unfold and fold share."""
    return (_pair(kernel_size, "kernel_size"), _pair(dilation, "dilation"),
            _pair(padding, "padding"), _pair(stride, "stride"))


def _blocks(size, k, d, p, s):
    """How many blocks of `k` taps `d` apart slide, `s` apart, along an
    axis of `size` padded by `p` on each side."""
    return (size + 2 * p - (k - 1) * d - 1) // s + 1


def _identity_kernel(kh, kw, dtype):
    # (kh*kw, 1, kh, kw): output channel t picks kernel tap t.
    return np.eye(kh * kw, dtype=dtype).reshape(kh * kw, 1, kh, kw)


def _patch_indices(padded_w, kh, kw, dh, dw, sh, sw, oh, ow):
    """Flat (row * padded_w + col) positions, (kh*kw, oh*ow): tap t of
    block l reads index[t, l] of the padded, flattened image."""
    ti, tj = np.divmod(np.arange(kh * kw), kw)
    a, b = np.divmod(np.arange(oh * ow), ow)
    rows = a[None, :] * sh + ti[:, None] * dh
    cols = b[None, :] * sw + tj[:, None] * dw
    return (rows * padded_w + cols).astype(np.int32)


def unfold(input, kernel_size, dilation=1, padding=0, stride=1):  # noqa: A002
    # A gather with a static index: exact (no multiply by identity taps,
    # so inf/NaN pixels stay where they are).
    from keras_ipu.backend import numpy as knp

    x = lax.tensor(input)
    if x.ndim != 4:
        raise ValueError(
            f"unfold takes a 4D (N, C, H, W) input; got shape {x.shape}."
        )
    (kh, kw), (dh, dw), (ph, pw), (sh, sw) = _block_args(kernel_size, dilation, padding, stride)
    n, c, h, w = x.shape
    if h is None or w is None:
        raise ValueError(
            f"unfold needs known spatial sizes; got input shape {x.shape}."
        )
    hp, wp = h + 2 * ph, w + 2 * pw
    oh, ow = _blocks(h, kh, dh, ph, sh), _blocks(w, kw, dw, pw, sw)
    if oh <= 0 or ow <= 0:
        raise ValueError(
            f"unfold: kernel_size={(kh, kw)} with dilation={(dh, dw)} does "
            f"not fit the padded input of size {(hp, wp)}."
        )
    if ph or pw:
        x = knp.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    flat = lax.reshape(x, (n, c, hp * wp))
    index = _patch_indices(wp, kh, kw, dh, dw, sh, sw, oh, ow)
    cols = knp.take(flat, index, axis=2)  # (N, C, kh*kw, L)
    return lax.reshape(cols, (n, None if c is None else c * kh * kw, oh * ow))


def fold(x, output_size, kernel_size, dilation=1, padding=0, stride=1):
    x = lax.tensor(x)
    if x.ndim != 3:
        raise ValueError(
            f"fold takes a 3D (N, C*kH*kW, L) input; got shape {x.shape}."
        )
    oh, ow = _pair(output_size, "output_size")
    (kh, kw), (dh, dw), (ph, pw), (sh, sw) = _block_args(kernel_size, dilation, padding, stride)
    n, ckk, length = x.shape
    if ckk is not None and ckk % (kh * kw):
        raise ValueError(
            f"fold: the channel dimension {ckk} must be divisible by the "
            f"kernel size product kH*kW = {kh * kw}."
        )
    span_h, span_w = (kh - 1) * dh + 1, (kw - 1) * dw + 1
    nh, nw = _blocks(oh, kh, dh, ph, sh), _blocks(ow, kw, dw, pw, sw)
    if length is not None and length != nh * nw:
        raise ValueError(
            f"fold: the input holds {length} blocks but output_size="
            f"{(oh, ow)}, kernel_size={(kh, kw)}, dilation={(dh, dw)}, "
            f"padding={(ph, pw)}, stride={(sh, sw)} give {nh}x{nw} = "
            f"{nh * nw}."
        )
    c = None if ckk is None else ckk // (kh * kw)
    planes = lax.reshape(
        x, (None if n is None or c is None else n * c, kh * kw, nh, nw)
    )
    # Adjoint of unfold's conv: the stride becomes input dilation, the
    # kernel is flipped, and the padding makes the output (oh, ow).
    kernel = _identity_kernel(kh, kw, x.dtype)[:, :, ::-1, ::-1]
    kernel = np.ascontiguousarray(kernel.transpose(1, 0, 2, 3))
    pads = []
    for out, blocks, s, span, p in ((oh, nh, sh, span_h, ph),
                                    (ow, nw, sw, span_w, pw)):
        lo = span - 1 - p
        hi = out - ((blocks - 1) * s + 1) - lo + span - 1
        pads.append((lo, hi))
    out = conv_general_dilated(
        planes,
        kernel,
        window_strides=(1, 1),
        padding=tuple(pads),
        lhs_dilation=(sh, sw),
        rhs_dilation=(dh, dw),
    )  # (N*C, 1, oh, ow)
    return lax.reshape(out, (n, c, oh, ow))


def _block_size(block_size):
    """block_size as an int, checked (Keras' message)."""
    if not isinstance(block_size, (int, np.integer)) or block_size < 2:
        raise ValueError(
            f"`block_size` must be at least 2. Received: block_size={block_size}"
        )
    return int(block_size)


def depth_to_space(x, block_size, data_format="channels_last"):
    b = _block_size(block_size)
    x = lax.tensor(x)
    if data_format == "channels_last":
        n, h, w, c = x.shape
        _check_divisible(c, b * b)
        new_c = None if c is None else c // (b * b)
        x = lax.reshape(x, (n, h, w, b, b, new_c))
        x = lax.transpose(x, (0, 1, 3, 2, 4, 5))
        return lax.reshape(x, (n, _times(h, b), _times(w, b), new_c))
    n, c, h, w = x.shape
    _check_divisible(c, b * b)
    new_c = None if c is None else c // (b * b)
    x = lax.reshape(x, (n, new_c, b, b, h, w))
    x = lax.transpose(x, (0, 1, 4, 2, 5, 3))
    return lax.reshape(x, (n, new_c, _times(h, b), _times(w, b)))


def space_to_depth(x, block_size, data_format="channels_last"):
    b = _block_size(block_size)
    x = lax.tensor(x)
    if data_format == "channels_last":
        n, h, w, c = x.shape
        nh, nw = _div(h, b, "height"), _div(w, b, "width")
        x = lax.reshape(x, (n, nh, b, nw, b, c))
        x = lax.transpose(x, (0, 1, 3, 2, 4, 5))
        return lax.reshape(x, (n, nh, nw, _times(c, b * b)))
    n, c, h, w = x.shape
    nh, nw = _div(h, b, "height"), _div(w, b, "width")
    x = lax.reshape(x, (n, c, nh, b, nw, b))
    x = lax.transpose(x, (0, 1, 3, 5, 2, 4))
    return lax.reshape(x, (n, _times(c, b * b), nh, nw))


def _times(d, k):
    return None if d is None else d * k


def _check_divisible(c, k):
    if c is not None and c % k:
        raise ValueError(
            f"The number of channels ({c}) must be divisible by "
            f"block_size**2 ({k})."
        )


def _div(d, b, name):
    if d is None:
        return None
    if d % b:
        raise ValueError(
            f"The {name} ({d}) must be divisible by block_size ({b})."
        )
    return d // b
