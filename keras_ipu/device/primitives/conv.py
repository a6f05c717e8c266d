"""Convolution: `conv_general_dilated`, as jax.lax defines it.

One primitive covers every convolution Keras needs, for any number of
spatial dimensions: strided, padded (negative padding crops), dilated on
the input (`lhs_dilation`: transposed convolution) or on the kernel
(`rhs_dilation`: atrous convolution), and grouped (`feature_group_count`:
depthwise/grouped convolution).

Layouts are given by `dimension_numbers = (lhs_spec, rhs_spec, out_spec)`,
each a tuple of axis indices: lhs_spec = (batch, feature, *spatial),
rhs_spec = (out_feature, in_feature, *spatial), out_spec = (batch, feature,
*spatial). So channels-last 2D input with an HWIO kernel is
((0, 3, 1, 2), (3, 2, 0, 1), (0, 3, 1, 2)).

The kernel picks one of three vectorised strategies (none loops over
output pixels): im2col (a strided window view of the padded input copied
once into patches, then one batched matmul over the groups); a tap loop of
shifted multiply-adds when every channel is its own group (depthwise: the
matmul would have an inner size of one); and, for input-dilated stride-1
convolutions (transposed convolutions, gradients of strided ones), one
matmul of the undilated input with every tap followed by a strided add per
tap, so the dilation holes are never multiplied.

Gradient rules: grads/conv.py (registered once every primitive exists).
"""

import math
import queue

import numpy as np

from keras_ipu.device import native
from keras_ipu.device.ir import ShapedArray
from keras_ipu.device.native import product_pool
from keras_ipu.device.native import threads as host_threads
from keras_ipu.device.primitives import cost_util as _cost
from keras_ipu.device.primitives import shape_rules
from keras_ipu.device.primitives.registry import Primitive


def default_dimension_numbers(ndim):
    """(N, C, *spatial) input, (O, I, *spatial) kernel, (N, C, *spatial)
    output, as lax's default."""
    spec = tuple(range(ndim))
    return (spec, spec, spec)


def _check_params(lhs, rhs, window_strides, padding, lhs_dilation, rhs_dilation,
                  dimension_numbers, feature_group_count):
    nsp = lhs.ndim - 2
    if rhs.ndim != lhs.ndim:
        raise shape_rules.ShapeError(
            f"conv: input rank {lhs.ndim} and kernel rank {rhs.ndim} differ; "
            "both must be (number of spatial dims + 2)."
        )
    for name, value in (
        ("window_strides", window_strides),
        ("padding", padding),
        ("lhs_dilation", lhs_dilation),
        ("rhs_dilation", rhs_dilation),
    ):
        if len(value) != nsp:
            raise shape_rules.ShapeError(
                f"conv: `{name}`={value} needs one entry per spatial "
                f"dimension ({nsp})."
            )
    for spec in dimension_numbers:
        if sorted(spec) != list(range(lhs.ndim)):
            raise shape_rules.ShapeError(
                f"conv: dimension_numbers {dimension_numbers} must hold "
                f"permutations of range({lhs.ndim})."
            )
    if min(window_strides, default=1) < 1 or min(
        tuple(lhs_dilation) + tuple(rhs_dilation), default=1
    ) < 1:
        raise shape_rules.ShapeError(
            f"conv: strides {window_strides} and dilations "
            f"{lhs_dilation}/{rhs_dilation} must be positive integers."
        )


def resolve_padding(padding, in_sizes, window_sizes, strides, lhs_dilation,
                    rhs_dilation):
    """Per-dim padding with every "SAME" entry (left where the size was
    unknown when the op was built) resolved now, or None if still unknown."""
    out = []
    for i, p in enumerate(padding):
        if p == "SAME":
            p = padding_for("SAME", [in_sizes[i]], [window_sizes[i]],
                            [strides[i]], [lhs_dilation[i]],
                            [rhs_dilation[i]])[0]
        out.append(p)
    return tuple(out)


def static_padding(padding, in_sizes, window_sizes, strides, lhs_dilation,
                   rhs_dilation):
    """The padding param of a primitive: (lo, hi) pairs, "SAME" for dims
    whose SAME padding needs a size unknown at trace time."""
    if isinstance(padding, str):
        padding = padding_for(padding, in_sizes, window_sizes, strides,
                              lhs_dilation, rhs_dilation)
    return tuple(
        "SAME" if p is None or p == "SAME" else (int(p[0]), int(p[1]))
        for p in padding
    )


def _out_dim(n, k, stride, pad, lhs_dil, rhs_dil):
    if n is None or k is None or pad is None:
        return None
    n_dilated = (n - 1) * lhs_dil + 1 if n > 0 else 0
    k_dilated = (k - 1) * rhs_dil + 1 if k > 0 else 0
    span = n_dilated + pad[0] + pad[1] - k_dilated
    return max(0, span // stride + 1) if span >= 0 else 0


def _conv_rule(lhs, rhs, *, window_strides, padding, lhs_dilation,
               rhs_dilation, dimension_numbers, feature_group_count):
    _check_params(lhs, rhs, window_strides, padding, lhs_dilation,
                  rhs_dilation, dimension_numbers, feature_group_count)
    dtype = shape_rules.same_dtype(lhs, rhs)
    lhs_spec, rhs_spec, out_spec = dimension_numbers
    g = feature_group_count
    channels = lhs.shape[lhs_spec[1]]
    k_in = rhs.shape[rhs_spec[1]]
    k_out = rhs.shape[rhs_spec[0]]
    if channels is not None and k_in is not None and channels != k_in * g:
        raise shape_rules.ShapeError(
            f"conv: the input has {channels} channels but the kernel takes "
            f"{k_in} input channels per group x {g} groups = {k_in * g}. "
            "The input channels must equal kernel in-channels times "
            "feature_group_count."
        )
    if k_out is not None and k_out % g:
        raise shape_rules.ShapeError(
            f"conv: kernel output channels {k_out} are not divisible by "
            f"feature_group_count={g}."
        )
    in_sizes = [lhs.shape[a] for a in lhs_spec[2:]]
    k_sizes = [rhs.shape[a] for a in rhs_spec[2:]]
    padding = resolve_padding(padding, in_sizes, k_sizes, window_strides,
                              lhs_dilation, rhs_dilation)
    spatial = tuple(
        _out_dim(*args)
        for args in zip(in_sizes, k_sizes, window_strides, padding,
                        lhs_dilation, rhs_dilation)
    )
    logical = (lhs.shape[lhs_spec[0]], k_out) + spatial
    shape = [None] * lhs.ndim
    for logical_axis, axis in enumerate(out_spec):
        shape[axis] = logical[logical_axis]
    return ShapedArray(tuple(shape), dtype)


def dilate_and_pad(x, axes, dilation, padding, value):
    """x with `dilation - 1` holes between elements along `axes`, then
    padded (lo, hi) with `value` (negative padding crops)."""
    shape = list(x.shape)
    for ax, d in zip(axes, dilation):
        if d > 1 and shape[ax] > 0:
            shape[ax] = (shape[ax] - 1) * d + 1
    if tuple(shape) != x.shape:
        out = np.zeros(shape, x.dtype)
        index = [slice(None)] * x.ndim
        for ax, d in zip(axes, dilation):
            index[ax] = slice(None, None, d)
        out[tuple(index)] = x
        x = out
    pads = [(0, 0)] * x.ndim
    for ax, (lo, hi) in zip(axes, padding):
        pads[ax] = (max(lo, 0), max(hi, 0))
    x = x[tuple(_crop_slices(x.shape, axes, padding))]
    if any(p != (0, 0) for p in pads):
        x = _pad_constant(x, pads, value)
    return x


def _pad_constant(x, pads, value):
    """np.pad(x, pads, constant_values=value) (the same values): the
    interior copied once and each padded axis' two border slabs filled,
    without np.pad's per-call Python (about a third of the Python time of
    a small block of a convolution split over the batch: 32 blocks of 4
    images per convolution of the benchmark CNN on 16 threads, each under
    the interpreter lock; issue 16, sixteenth pass)."""
    shape = tuple(n + lo + hi for n, (lo, hi) in zip(x.shape, pads))
    out = np.empty(shape, x.dtype)
    out[tuple(slice(lo, lo + n) for n, (lo, _) in zip(x.shape, pads))] = x
    full = [slice(None)] * x.ndim
    for ax, (lo, hi) in enumerate(pads):
        for border in ((slice(0, lo),) if lo else ()) + ((slice(lo + x.shape[ax], None),)
                                                           if hi else ()):
            full[ax] = border
            out[tuple(full)] = value
        full[ax] = slice(None)
    return out


def _crop_slices(shape, axes, padding):
    index = [slice(None)] * len(shape)
    for ax, (lo, hi) in zip(axes, padding):
        start = -lo if lo < 0 else 0
        stop = shape[ax] + hi if hi < 0 else shape[ax]
        index[ax] = slice(start, max(start, stop))
    return index


def _compute_dtype(dtype):
    # Half-precision products accumulate in float32, as the IPU's AMP units do.
    if dtype.kind == "f" and dtype.itemsize < 4 or dtype.name == "bfloat16":
        return np.dtype(np.float32)
    if dtype.kind == "b":
        return np.dtype(np.int32)
    return dtype


def _conv(lhs, rhs, *, window_strides, padding, lhs_dilation, rhs_dilation,
          dimension_numbers, feature_group_count):
    out_dtype = np.result_type(lhs, rhs)
    lhs_spec, rhs_spec, out_spec = dimension_numbers
    work = _compute_dtype(out_dtype)
    x = np.transpose(lhs, lhs_spec).astype(work, copy=False)  # N, C, *S
    w = np.transpose(rhs, rhs_spec).astype(work, copy=False)  # O, I, *K
    padding = resolve_padding(padding, x.shape[2:], w.shape[2:],
                              window_strides, lhs_dilation, rhs_dilation)
    out_sp = tuple(
        _out_dim(*args)
        for args in zip(x.shape[2:], w.shape[2:], window_strides, padding,
                        lhs_dilation, rhs_dilation)
    )
    n, o = x.shape[0], w.shape[0]
    if 0 in out_sp or 0 in (n, o) or 0 in w.shape[2:] or 0 in x.shape[2:]:
        out = np.zeros((n, o) + out_sp, out_dtype)
    elif max(lhs_dilation) > 1 and max(window_strides) == 1:
        out = _scatter_conv(x, w, padding, lhs_dilation, rhs_dilation,
                            feature_group_count)
    elif feature_group_count == x.shape[1]:
        out = _depthwise_conv(x, w, window_strides, padding, lhs_dilation,
                              rhs_dilation)
    elif (feature_group_count == 1 and max(lhs_dilation) == 1
          and np.prod(w.shape[2:]) > np.prod(out_sp)):
        out = _weight_gradient_in_image_blocks(x, w, out_sp, window_strides, padding,
                                               rhs_dilation)
        if out is None:
            out = _large_window_conv(x, w, out_sp, window_strides, padding,
                                     rhs_dilation)
    else:
        out = _im2col_conv_over_batch(x, w, out_sp, window_strides, padding,
                                      lhs_dilation, rhs_dilation,
                                      feature_group_count)
    out = np.transpose(out, np.argsort(out_spec))
    return np.ascontiguousarray(out.astype(out_dtype, copy=False))


def _im2col_conv_over_batch(x, w, out_sp, window_strides, padding,
                            lhs_dilation, rhs_dilation, g):
    """_im2col_conv on the threads its work is worth (device/native/
    threads.py's policy), split over the batch: each thread pads, copies
    the patches of and multiplies its own images, so the whole convolution
    runs in parallel, not its product alone (the patch copy and the pad
    are most of a small-channel convolution's time). One thread: as is."""
    n, o = x.shape[0], w.shape[0]
    flops = 2 * n * int(np.prod(out_sp)) * o * int(np.prod(w.shape[1:]))
    threads = min(host_threads.threads_for(flops), n)
    args = (window_strides, padding, lhs_dilation, rhs_dilation, g)
    if threads <= 1:
        return _im2col_conv(x, w, *args)
    blocks = host_threads.ranges(n, 1, threads)
    # N, *P, O: each block's product lands in its rows, in memory order.
    out = np.empty((n,) + tuple(out_sp) + (o,), np.result_type(x.dtype, w.dtype))

    def part(j):
        lo, hi = blocks[j]
        _im2col_conv(x[lo:hi], w, *args, matmul=product_pool.matmul, out=out[lo:hi])

    host_threads.parallel_for(part, len(blocks), threads)
    return np.moveaxis(out, -1, 1)  # N, O, *P


# Bytes of patches copied and multiplied at a time where a convolution's
# patches are larger (whole images each): the copy's writes then stay in
# the cache for the product to read, where one patch matrix of tens of
# megabytes went to memory and back (and its fresh pages were faulted in
# at every call). Measured on this project's 2-core VM (benchmarks/
# README.md, issue 16 thirteenth pass, s13cnn; one thread, load 6): the
# benchmark CNN's second input gradient (128x16x16x64 -> 32 channels, 75
# MB of patches) 46 -> 28 ms, its forward convolution (37 MB) 28 -> 19-23.
# Each block's product packs the filters again: a block holds at least
# FILTER_REPACKS_PER_BLOCK times their bytes, so that the repacking stays
# small beside it (ResNet-18's 3x3 512-channel convolution at batch 32,
# 9.4 MB of filters for 9.4 MB of patches, gains nothing from blocks).
PATCH_BLOCK_BYTES = 2 << 20
FILTER_REPACKS_PER_BLOCK = 8


def _im2col_conv(x, w, window_strides, padding, lhs_dilation, rhs_dilation,
                 g, matmul=host_threads.matmul, out=None):
    """x (N, C, *S), w (O, I, *K) -> (N, O, *P): a window view of the padded
    input, copied into patches, then one matmul per group. Works
    channels-last, so a channels-last input is read in memory order.
    `matmul`: one whole product (product_pool.matmul) inside a thread of
    _im2col_conv_over_batch; `out`:
    its (N, *P, O) rows of the result, written in place."""
    nsp = x.ndim - 2
    n, c = x.shape[:2]
    o, i = w.shape[:2]
    ksize = w.shape[2:]
    x = _moved(x, 1, -1)  # N, *S, C
    x = dilate_and_pad(x, tuple(range(1, 1 + nsp)), lhs_dilation, padding, 0)
    span = tuple((k - 1) * d + 1 for k, d in zip(ksize, rhs_dilation))
    out_sp = tuple(
        (s - k) // st + 1 for s, k, st in zip(x.shape[1:-1], span, window_strides)
    )
    win = np.lib.stride_tricks.sliding_window_view(
        x, span, axis=tuple(range(1, 1 + nsp))
    )  # N, *P_all, C, *span
    index = (slice(None),)
    index += tuple(slice(None, None, st) for st in window_strides)
    index += (slice(None),)
    index += tuple(slice(None, None, d) for d in rhs_dilation)
    win = win[index]  # N, *P, C, *K
    npix = n * math.prod(out_sp)
    width = i * math.prod(ksize)
    # Patch rows tap-major (*K, C) where the patches are the larger
    # operand (a forward convolution, an input gradient): their copy then
    # moves runs of C contiguous channels, where channel-major rows (C,
    # *K) gather one element per input pixel (1.5-2x these convolutions'
    # time on the benchmark CNN; issue 16, twelfth pass). A weight
    # gradient's "filters" (the output gradient, window the size of the
    # image) are the larger: they keep the channel-major rows, which
    # read them in fewer, longer runs.
    tap_major = o <= npix
    if tap_major:
        win = _moved(win, 1 + nsp, -1)  # N, *P, *K, C
        w = _moved(w, 1, -1)  # O, *K, I
        grouped = (n,) + out_sp + ksize + (g, i)
        group_axis = 1 + 2 * nsp
    else:
        grouped = (n,) + out_sp + (g, i) + ksize
        group_axis = 1 + nsp
    filters = w.reshape(g, o // g, width).transpose(0, 2, 1)
    block_bytes = max(PATCH_BLOCK_BYTES, FILTER_REPACKS_PER_BLOCK * filters.nbytes)
    if g == 1 and tap_major and n > 1 and npix * width * x.itemsize > 2 * block_bytes:
        copy = _patch_copy(x, win, ksize, window_strides, rhs_dilation)
        return _blocked_im2col_product(win, filters[0], n, out_sp, o, matmul, out,
                                       block_bytes, copy)
    if g == 1:
        patches = win.reshape(1, npix, width)
    else:
        win = _moved(win.reshape(grouped), group_axis, 0)  # G, N, *P, row
        patches = win.reshape(g, npix, width)
    result = matmul(patches, filters)  # G, N*P, Og
    result = result.reshape((g, n) + out_sp + (o // g,))
    result = _moved(result, 0, -2).reshape((n,) + out_sp + (o,))
    if out is not None:
        out[...] = result
    return _moved(result, -1, 1)  # N, O, *P


def _moved(a, source, destination):
    """np.moveaxis(a, source, destination) for one axis (the same view),
    without its argument checks: five per call of _im2col_conv, a third of
    its Python time in a small block of a split convolution."""
    nd = a.ndim
    order = [i for i in range(nd) if i != source % nd]
    order.insert(destination % nd, source % nd)
    return a.transpose(order)


def _patch_copy(xp, win, ksize, window_strides, rhs_dilation):
    """copy(lo, hi, block): the patches of images lo..hi (win[lo:hi], N,
    *P, *K, C, a window view of the padded channels-last input `xp`) into
    `block`: in one C loop of runs for a 2-d convolution of float32 or
    float64 where native/_im2col.c is built, else NumPy's copy."""
    def numpy_copy(lo, hi, block):
        np.copyto(block, win[lo:hi])

    if (native.im2col is None or len(ksize) != 2 or xp.dtype not in native.FLOAT_DTYPES
            or not xp.flags.c_contiguous):
        return numpy_copy
    geometry = (*xp.shape[1:], *win.shape[1:3], *ksize, *window_strides, *rhs_dilation)
    patches = native.im2col.patches

    def native_copy(lo, hi, block):
        if not patches(xp, block, lo, hi, *geometry):
            numpy_copy(lo, hi, block)

    return native_copy


def _blocked_im2col_product(win, filters, n, out_sp, o, matmul, out, block_bytes, copy):
    """The patches of `win` (N, *P, *K, C) times `filters` (width, O), a
    few images at a time (about `block_bytes` of patches, copied by
    `copy`: _patch_copy) through one reused buffer, each block's product
    written into its rows of the result."""
    pix = int(np.prod(out_sp))
    width = filters.shape[0]
    step = max(1, block_bytes // (pix * width * win.itemsize))
    if out is None:
        out = np.empty((n,) + tuple(out_sp) + (o,), np.result_type(win.dtype, filters.dtype))
    rows = out.reshape(n * pix, o)
    buffer = np.empty((min(step, n),) + win.shape[1:], win.dtype)
    for lo in range(0, n, step):
        hi = min(n, lo + step)
        block = buffer[:hi - lo]
        copy(lo, hi, block)
        matmul(block.reshape(-1, width), filters, out=rows[lo * pix:hi * pix])
    return np.moveaxis(out, -1, 1)  # N, O, *P


def _weight_gradient_in_image_blocks(x, w, out_sp, window_strides, padding,
                                     rhs_dilation):
    """A window larger than the output (a weight gradient: x (N, C, *S) is
    the forward input with its channels N and batch C swapped, w (O, C,
    *K) the output gradient, K the forward output's pixels, the output
    (N, O, *P) the filters' gradient over their taps P) as a sum over
    blocks of the forward batch: each block copies its images' forward
    patches (rows (image, pixel), columns (*P, N): the forward
    convolution's im2col, runs of the forward input's channels in memory
    order, in C where native/_im2col.c is built) and multiplies their
    transpose by its rows of the output gradient, a view. The blocks are
    independent jobs of the pool (each thread its own patch buffer), and
    their (P*N, O) partial products are summed in block order, so the
    bits do not depend on the threads. Block bounds come from the shapes
    alone (PATCH_BLOCK_BYTES of patches, and at least
    FILTER_REPACKS_PER_BLOCK partials' bytes). None where that makes one
    block: _large_window_conv then runs it as one product.
    Measured on this project's 2-core VM (benchmarks/README.md, issue 16
    fifteenth pass, s15cnn; one thread): the benchmark CNN's weight
    gradients 3x3x3 -> 32 9.6 -> 7.4 ms, 3x3x32 -> 64 25.6 -> 17.0 ms
    (its patches' copy as one product's operand moved runs of 3 and 32
    elements, and ran on the caller's thread alone)."""
    nsp = x.ndim - 2
    cin, batch = x.shape[:2]
    o = w.shape[0]
    pixels = w.shape[2:]  # the forward output's
    pix = int(np.prod(pixels))
    width = int(np.prod(out_sp)) * cin
    if 0 in (width, batch, o):  # no patches (and a block's bytes would divide by 0)
        return None
    step = max(1, PATCH_BLOCK_BYTES // (pix * width * x.itemsize),
               -(-FILTER_REPACKS_PER_BLOCK * o // pix))
    edges = tuple(range(0, batch, step)) + (batch,)
    blocks = len(edges) - 1
    if blocks < 2:
        return None
    images = np.moveaxis(x, 0, -1)  # batch, *S, N: the forward input
    grads = np.moveaxis(w, 0, -1)  # batch, *K, O: the output gradient
    spatial = tuple(range(1, 1 + nsp))
    span = tuple((p - 1) * st + 1 for p, st in zip(out_sp, window_strides))
    reach = tuple((k - 1) * d + 1 for k, d in zip(pixels, rhs_dilation))
    dtype = np.result_type(x.dtype, w.dtype)
    partials = np.empty((blocks, width, o), dtype)
    flops = 2 * batch * pix * width * o
    threads = min(host_threads.threads_for(flops), blocks)
    buffers = queue.SimpleQueue()
    for _ in range(threads):
        buffers.put(None)

    def part(j):
        lo, hi = edges[j], edges[j + 1]
        xp = dilate_and_pad(images[lo:hi], spatial, (1,) * nsp, padding, 0)
        win = np.lib.stride_tricks.sliding_window_view(xp, span, axis=spatial)
        index = (slice(None),)
        index += tuple(slice(None, r, d) for r, d in zip(reach, rhs_dilation))
        index += (slice(None),)
        index += tuple(slice(None, None, st) for st in window_strides)
        win = np.moveaxis(win[index], 1 + nsp, -1)  # b, *K, *P, N
        buffer = buffers.get()
        if buffer is None:
            buffer = np.empty((step,) + win.shape[1:], win.dtype)
        block = buffer[:hi - lo]
        _patch_copy(np.ascontiguousarray(xp), win, out_sp, rhs_dilation,
                    window_strides)(0, hi - lo, block)
        product_pool.matmul(block.reshape(-1, width).T, grads[lo:hi].reshape(-1, o),
                            out=partials[j])
        buffers.put(buffer)

    host_threads.parallel_for(part, blocks, threads)
    total = np.add.reduce(partials, axis=0)  # block order, whatever the threads
    total = total.reshape(tuple(out_sp) + (cin, o))
    return np.moveaxis(np.moveaxis(total, -2, 0), -1, 1)  # N, O, *P


def _large_window_conv(x, w, out_sp, window_strides, padding, rhs_dilation):
    """x (N, C, *S), w (O, C, *K) -> (N, O, *P) for a window larger than
    the output: a weight gradient, whose window is the output gradient
    and whose "batch" N and "channels" C are the forward input's channels
    and batch. Its output positions and window taps swap roles: one
    product of the input's windows of the output's size, rows (C, *K) by
    columns (*P, N), with the window's rows (C, *K, O). Both are read in
    the forward arrays' own (channels-last) memory order: the copy moves
    runs of N contiguous elements and w is a view, where im2col's patches
    (N, *P) by (C, *K) gathered one element per pixel from both
    (issue 16, twelfth pass)."""
    nsp = x.ndim - 2
    n, c = x.shape[:2]
    o = w.shape[0]
    ksize = w.shape[2:]
    spatial = tuple(range(1, 1 + nsp))
    xp = dilate_and_pad(np.moveaxis(x, 0, -1), spatial, (1,) * nsp, padding, 0)  # C, *S, N
    span = tuple((p - 1) * st + 1 for p, st in zip(out_sp, window_strides))
    win = np.lib.stride_tricks.sliding_window_view(xp, span, axis=spatial)  # C, *T, N, *span
    index = (slice(None),)
    index += tuple(slice(None, (k - 1) * d + 1, d) for k, d in zip(ksize, rhs_dilation))
    index += (slice(None),)
    index += tuple(slice(None, None, st) for st in window_strides)
    win = np.moveaxis(win[index], 1 + nsp, -1)  # C, *K, *P, N
    width = c * int(np.prod(ksize))
    patches = win.reshape(width, int(np.prod(out_sp)) * n)
    filters = np.moveaxis(w, 0, -1).reshape(width, o)  # C, *K, O
    out = host_threads.matmul(patches.T, filters)  # (*P, N), O
    out = np.moveaxis(out.reshape(tuple(out_sp) + (n, o)), nsp, 0)  # N, *P, O
    return np.moveaxis(out, -1, 1)  # N, O, *P


def _depthwise_conv(x, w, window_strides, padding, lhs_dilation,
                    rhs_dilation):
    """One group per input channel: a matmul would have an inner size of
    one, so multiply-add one shifted view per kernel tap instead, in
    channels-last order (vectorised over batch, pixels and channels)."""
    nsp = x.ndim - 2
    n, c = x.shape[:2]
    o = w.shape[0]
    mult = o // c
    ksize = w.shape[2:]
    x = np.moveaxis(x, 1, -1)  # N, *S, C (a view of a channels-last input)
    x = dilate_and_pad(x, tuple(range(1, 1 + nsp)), lhs_dilation, padding, 0)
    x = np.ascontiguousarray(x)
    span = tuple((k - 1) * d + 1 for k, d in zip(ksize, rhs_dilation))
    out_sp = tuple(
        (s - k) // st + 1 for s, k, st in zip(x.shape[1:-1], span, window_strides)
    )
    taps = w.reshape((c, mult) + ksize)  # C, M, *K
    out = np.zeros((n,) + out_sp + (c, mult), x.dtype)
    for t in np.ndindex(*ksize):
        view = x[(slice(None),) + tuple(
            slice(tt * d, tt * d + (p - 1) * st + 1, st)
            for tt, d, p, st in zip(t, rhs_dilation, out_sp, window_strides)
        )]
        out += view[..., None] * taps[(slice(None), slice(None)) + t]
    out = out.reshape((n,) + out_sp + (o,))
    return np.moveaxis(out, -1, 1)


def _scatter_conv(x, w, padding, lhs_dilation, rhs_dilation, g):
    """Stride-1 conv of an input-dilated x (a transposed convolution)
    without multiplying the dilation holes: every input pixel times every
    tap in one matmul, then one strided add per kernel tap into the output
    (col2im). Output p gets x[i] * w[t] where p = i * s + lo - t * d."""
    nsp = x.ndim - 2
    n, c = x.shape[:2]
    o, i = w.shape[:2]
    ksize = w.shape[2:]
    in_sp = x.shape[2:]
    taps = int(np.prod(ksize))
    og = o // g
    # (G, N*S, Cg) @ (G, Cg, K*Og) -> (G, N, *S, *K, Og)
    xs = np.moveaxis(x.reshape((n, g, i) + in_sp), 1, 0)
    xs = np.moveaxis(xs, 2, -1).reshape(g, -1, i)
    ws = w.reshape((g, og, i) + ksize)
    ws = np.moveaxis(ws, 1, -1).reshape(g, i, taps * og)
    y = host_threads.matmul(xs, ws).reshape((g, n) + in_sp + ksize + (og,))
    # The buffer spans every index p can take, from lo - (k-1)d up.
    lows = [lo - (k - 1) * d for (lo, _), k, d in zip(padding, ksize, rhs_dilation)]
    length = [(m - 1) * s + (k - 1) * d + 1
              for m, s, k, d in zip(in_sp, lhs_dilation, ksize, rhs_dilation)]
    buf = np.zeros((g, n) + tuple(length) + (og,), y.dtype)
    s_axes = tuple(range(2, 2 + nsp))
    for t in np.ndindex(*ksize):
        where = tuple(
            slice((k - 1 - tt) * d, (k - 1 - tt) * d + (m - 1) * s + 1, s)
            for tt, k, d, m, s in zip(t, ksize, rhs_dilation, in_sp,
                                      lhs_dilation)
        )
        buf[(slice(None), slice(None)) + where] += y[
            (slice(None), slice(None)) + (slice(None),) * nsp + t
        ]
    # Output p is buffer index p - low: crop or zero-extend both ends.
    pads = tuple(
        (low, hi - (k - 1) * d)
        for low, (_, hi), k, d in zip(lows, padding, ksize, rhs_dilation)
    )
    out = dilate_and_pad(buf, s_axes, (1,) * nsp, pads, 0)  # G, N, *P, Og
    out = np.moveaxis(out, 0, -2)
    out = out.reshape(out.shape[:-2] + (o,))
    return np.moveaxis(out, -1, 1)


conv_general_dilated_p = Primitive(
    "conv_general_dilated",
    _conv_rule,
    _conv,
    fp_class="accumulating",
    doc="lax.conv_general_dilated: N-d grouped, strided, dilated convolution.",
)


def _int_tuple(value, n, name):
    if value is None:
        return (1,) * n
    if isinstance(value, int):
        return (value,) * n
    value = tuple(int(v) for v in value)
    if len(value) != n:
        raise ValueError(
            f"`{name}`={value} needs {n} entries, one per spatial dimension."
        )
    return value


def conv_general_dilated(
    lhs,
    rhs,
    window_strides=None,
    padding="VALID",
    lhs_dilation=None,
    rhs_dilation=None,
    dimension_numbers=None,
    feature_group_count=1,
):
    """Bind conv_general_dilated with normalised static params.

    padding: "VALID", "SAME" (output = ceil(input / stride), extra padding
    at the end, as XLA) or a sequence of (lo, hi) pairs. A SAME padding
    that needs an unknown size stays "SAME" in the params and is resolved
    from the actual shape.
    """
    ndim = len(lhs.shape)
    nsp = ndim - 2
    if dimension_numbers is None:
        dimension_numbers = default_dimension_numbers(ndim)
    dimension_numbers = tuple(tuple(int(a) for a in s) for s in dimension_numbers)
    window_strides = _int_tuple(window_strides, nsp, "window_strides")
    lhs_dilation = _int_tuple(lhs_dilation, nsp, "lhs_dilation")
    rhs_dilation = _int_tuple(rhs_dilation, nsp, "rhs_dilation")
    lhs_spec, rhs_spec, _ = dimension_numbers
    padding = static_padding(
        padding,
        [lhs.shape[a] for a in lhs_spec[2:]],
        [rhs.shape[a] for a in rhs_spec[2:]],
        window_strides,
        lhs_dilation,
        rhs_dilation,
    )
    return conv_general_dilated_p.bind(
        lhs,
        rhs,
        window_strides=window_strides,
        padding=padding,
        lhs_dilation=lhs_dilation,
        rhs_dilation=rhs_dilation,
        dimension_numbers=dimension_numbers,
        feature_group_count=int(feature_group_count),
    )


def padding_for(mode, in_sizes, window_sizes, strides, lhs_dilation=None,
                rhs_dilation=None):
    """(lo, hi) pairs for the string padding modes "VALID" and "SAME".

    A strided SAME padding depends on the size: where the size is unknown
    (None, while tracing) the pair is None.
    """
    n = len(in_sizes)
    lhs_dilation = lhs_dilation or (1,) * n
    rhs_dilation = rhs_dilation or (1,) * n
    mode = mode.upper()
    if mode == "VALID":
        return tuple((0, 0) for _ in range(n))
    if mode != "SAME":
        raise ValueError(
            f"Unknown padding {mode!r}: use 'valid', 'same' or explicit "
            "(low, high) pairs."
        )
    pads = []
    for size, k, s, ld, rd in zip(in_sizes, window_sizes, strides,
                                  lhs_dilation, rhs_dilation):
        if k is not None and s == 1:
            total = (k - 1) * rd
            pads.append((total // 2, total - total // 2))
            continue
        if size is None or k is None:
            # Depends on a size known only when the program runs.
            pads.append(None)
            continue
        size = (size - 1) * ld + 1 if size > 0 else 0
        k = (k - 1) * rd + 1
        out = -(-size // s)
        total = max((out - 1) * s + k - size, 0)
        pads.append((total // 2, total - total // 2))
    return tuple(pads)


def conv_transpose(lhs, rhs, strides, padding, rhs_dilation=None,
                   dimension_numbers=None):
    """Transposed convolution as an input-dilated convolution (stride 1,
    lhs_dilation = strides). padding: explicit (lo, hi) pairs on the
    dilated input. The kernel is used as given: the caller flips its
    spatial axes when it wants the gradient-of-conv convention.
    """
    nsp = len(lhs.shape) - 2
    return conv_general_dilated(
        lhs,
        rhs,
        window_strides=(1,) * nsp,
        padding=padding,
        lhs_dilation=strides,
        rhs_dilation=rhs_dilation,
        dimension_numbers=dimension_numbers,
    )


# -- cost rules (formulas and constants: keras_ipu/device/simulator/cost_model.py)


def _conv_cost(ins, outs, *, dimension_numbers, **params):
    # Each output element takes (kernel window x input features per group)
    # MACs: the kernel's size divided by its output features.
    out_features = ins[1].shape[dimension_numbers[1][0]] or 0
    per_out = _cost.size(ins[1]) // out_features if out_features else 0
    macs = _cost.size(outs[0]) * per_out
    return _cost.make(ins, outs, "matmul", 2 * macs, macs)


conv_general_dilated_p.cost = _conv_cost
