"""conv_general_dilated, reduce_window and select_and_scatter_add (max/min
pool gradients) against naive NumPy loops."""

import itertools

import numpy as np
import pytest

from keras_ipu.device import native
from keras_ipu.device.ir import ShapedArray
from keras_ipu.device.primitives import pooling
from keras_ipu.device.primitives.conv import _pad_constant
from keras_ipu.device.primitives.conv import conv_general_dilated
from keras_ipu.device.primitives.conv import conv_general_dilated_p
from keras_ipu.device.primitives.conv import conv_transpose
from keras_ipu.device.primitives.pooling import reduce_window
from keras_ipu.device.primitives.pooling import reduce_window_p
from keras_ipu.device.primitives.pooling import select_and_scatter_add
from keras_ipu.device.trace import GraphBuilder

RNG = np.random.default_rng(0)


def _dilate(x, axes, dilation):
    shape = list(x.shape)
    for ax, d in zip(axes, dilation):
        shape[ax] = (shape[ax] - 1) * d + 1
    out = np.zeros(shape, x.dtype)
    out[tuple(slice(None, None, d) if i in axes else slice(None)
              for i, d in zip(range(x.ndim), [1] * 2 + list(dilation)))] = x
    return out


def _pad(x, axes, padding, value):
    for ax, (lo, hi) in zip(axes, padding):
        if lo < 0:
            x = np.take(x, np.arange(-lo, x.shape[ax]), axis=ax)
            lo = 0
        if hi < 0:
            x = np.take(x, np.arange(0, x.shape[ax] + hi), axis=ax)
            hi = 0
        width = [(0, 0)] * x.ndim
        width[ax] = (lo, hi)
        x = np.pad(x, width, constant_values=value)
    return x


def naive_conv(x, w, strides, padding, lhs_dil, rhs_dil, groups):
    """x: N, C, *S; w: O, I, *K; loops over output pixels and taps."""
    nsp = x.ndim - 2
    axes = tuple(range(2, 2 + nsp))
    x = _dilate(x.astype(np.float64), axes, lhs_dil)
    x = _pad(x, axes, padding, 0.0)
    n, c = x.shape[:2]
    o, i = w.shape[:2]
    k = w.shape[2:]
    span = [(kk - 1) * d + 1 for kk, d in zip(k, rhs_dil)]
    out_sp = [max(0, (s - sp) // st + 1) if s >= sp else 0
              for s, sp, st in zip(x.shape[2:], span, strides)]
    out = np.zeros([n, o] + out_sp)
    og = o // groups
    for p in itertools.product(*[range(q) for q in out_sp]):
        for t in itertools.product(*[range(kk) for kk in k]):
            src = tuple(pp * st + tt * d
                        for pp, st, tt, d in zip(p, strides, t, rhs_dil))
            for g in range(groups):
                xs = x[(slice(None), slice(g * i, (g + 1) * i)) + src]
                ws = w[(slice(g * og, (g + 1) * og), slice(None)) + t]
                out[(slice(None), slice(g * og, (g + 1) * og)) + p] += xs @ ws.T
    return out


CASES = [
    # (spatial, kernel, strides, padding, lhs_dil, rhs_dil, groups)
    ((9,), (3,), (1,), ((0, 0),), (1,), (1,), 1),
    ((9,), (3,), (2,), ((1, 2),), (1,), (2,), 1),
    ((8,), (2,), (1,), ((-1, 1),), (2,), (1,), 2),
    ((7, 6), (3, 2), (1, 1), ((1, 1), (0, 1)), (1, 1), (1, 1), 1),
    ((7, 6), (3, 3), (2, 3), ((0, 0), (2, 2)), (1, 1), (2, 1), 3),
    ((5, 5), (3, 3), (1, 1), ((2, 2), (2, 2)), (2, 2), (1, 1), 1),
    ((5, 4, 6), (2, 3, 2), (1, 2, 1), ((1, 0), (1, 1), (0, 0)), (1, 1, 1),
     (1, 1, 2), 1),
    ((4, 4, 4), (3, 2, 2), (2, 1, 1), ((1, 1), (0, 0), (1, 0)), (1, 2, 1),
     (1, 1, 1), 3),
    # One group per channel: the depthwise (tap loop) path.
    ((9, 8), (3, 2), (2, 3), ((1, 2), (0, 1)), (1, 1), (2, 1), 6),
    ((7,), (2,), (2,), ((1, -1),), (2,), (1,), 6),
    # Input-dilated, stride 1: the transposed-convolution (scatter) path.
    ((5,), (3,), (1,), ((2, 3),), (3,), (2,), 3),
    ((4, 3), (3, 2), (1, 1), ((-1, 2), (1, -1)), (2, 3), (1, 2), 2),
    ((3, 2, 3), (2, 2, 3), (1, 1, 1), ((1, 1), (0, 2), (2, 2)), (2, 3, 1),
     (2, 1, 1), 6),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{len(c[0])}d")
def test_conv_matches_naive_reference(case):
    spatial, ksize, strides, padding, ld, rd, groups = case
    x = RNG.standard_normal((2, 6) + spatial).astype(np.float32)
    w = RNG.standard_normal((6, 6 // groups) + ksize).astype(np.float32)
    got = conv_general_dilated(x, w, strides, padding, ld, rd,
                               feature_group_count=groups)
    want = naive_conv(x, w, strides, padding, ld, rd, groups)
    assert got.shape == want.shape
    assert got.dtype == np.float32
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("case", [c for c in CASES if c[4] == (1,) * len(c[0])
                                  and c[6] != 6], ids=lambda c: f"{len(c[0])}d")
def test_conv_split_over_the_batch_matches_the_reference(case, monkeypatch):
    # Every im2col case on 3 threads (7 images in blocks of 2, the last of
    # one), against the naive reference and the one-thread kernel.
    from keras_ipu.device.native import threads

    spatial, ksize, strides, padding, ld, rd, groups = case
    x = RNG.standard_normal((7, 6) + spatial).astype(np.float32)
    w = RNG.standard_normal((6, 6 // groups) + ksize).astype(np.float32)
    monkeypatch.setattr(threads, "_cap", 1)
    one = np.asarray(conv_general_dilated(x, w, strides, padding, ld, rd,
                                          feature_group_count=groups))
    monkeypatch.setattr(threads, "_cap", 3)
    monkeypatch.setattr(threads, "FLOPS_PER_THREAD", 1)
    calls = []
    split = threads.parallel_for
    monkeypatch.setattr(threads, "parallel_for",
                        lambda fn, count, n: calls.append((count, n)) or split(fn, count, n))
    got = np.asarray(conv_general_dilated(x, w, strides, padding, ld, rd,
                                          feature_group_count=groups))
    assert calls and calls[0] == (4, 3)
    want = naive_conv(x, w, strides, padding, ld, rd, groups)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    # Not bit for bit: BLAS may sum a smaller block's rows in another order.
    np.testing.assert_allclose(got, one, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("case", [c for c in CASES if c[6] == 1 and c[4] == (1,) * len(c[0])],
                         ids=lambda c: f"{len(c[0])}d-{c[1]}")
def test_conv_patches_in_blocks_of_images_match_the_reference(case, threads, monkeypatch):
    # Patches larger than two blocks are copied and multiplied a few
    # images at a time (here one image per block), on one thread and
    # inside each thread of the batch split (7 images in parts of 2, 2, 2
    # and 1: a part of one image is multiplied whole).
    from keras_ipu.device.native import threads as host_threads
    from keras_ipu.device.primitives import conv

    spatial, ksize, strides, padding, ld, rd, groups = case
    x = RNG.standard_normal((7, 6) + spatial).astype(np.float32)
    w = RNG.standard_normal((5, 6) + ksize).astype(np.float32)
    want = naive_conv(x, w, strides, padding, ld, rd, groups)
    whole = np.asarray(conv_general_dilated(x, w, strides, padding, ld, rd))
    out_pixels = int(np.prod(whole.shape[2:]))
    monkeypatch.setattr(conv, "PATCH_BLOCK_BYTES", out_pixels * 6 * int(np.prod(ksize)) * 4 // 2)
    monkeypatch.setattr(conv, "FILTER_REPACKS_PER_BLOCK", 0)
    monkeypatch.setattr(host_threads, "_cap", threads)
    monkeypatch.setattr(host_threads, "FLOPS_PER_THREAD", 1)
    blocked = []
    real = conv._blocked_im2col_product
    monkeypatch.setattr(conv, "_blocked_im2col_product",
                        lambda win, *args: blocked.append(len(win)) or real(win, *args))
    got = np.asarray(conv_general_dilated(x, w, strides, padding, ld, rd))
    assert sorted(blocked) == ([7] if threads == 1 else [2, 2, 2])
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got, whole, rtol=1e-5, atol=1e-5)


def test_blocked_patch_products_split_on_the_c_pool_in_place_with_one_threads_bits(
        monkeypatch):
    # Where the batch does not split (its work under two threads' worth)
    # each block's product may still split on the C pool
    # (host_threads.matmul): its blocks write into the block's rows of the
    # result (out=), with np.matmul's bits, so the whole convolution has
    # the bits of one thread.
    from keras_ipu.device.native import product_pool
    from keras_ipu.device.native import threads as host_threads
    from keras_ipu.device.primitives import conv

    if not host_threads.product_pool_takes(0, np.float32):
        pytest.skip("no C pool for float32 products here")
    x = RNG.standard_normal((8, 16, 20, 20)).astype(np.float32)
    w = RNG.standard_normal((32, 16, 3, 3)).astype(np.float32)
    padding = ((0, 0), (0, 0))
    # two images a block: 2 x 18 x 18 patch rows of 3 x 3 x 16
    monkeypatch.setattr(conv, "PATCH_BLOCK_BYTES", 2 * 18 * 18 * 144 * 4)
    monkeypatch.setattr(conv, "FILTER_REPACKS_PER_BLOCK", 0)
    monkeypatch.setattr(host_threads, "_plans", {})
    monkeypatch.setattr(host_threads, "_cap", 1)
    one = np.asarray(conv_general_dilated(x, w, (1, 1), padding))
    monkeypatch.setattr(host_threads, "_cap", 2)
    monkeypatch.setattr(host_threads, "_plans", {})  # planned again at two threads
    monkeypatch.setattr(host_threads, "FLOPS_PER_THREAD", 10 ** 12)  # no batch split
    monkeypatch.setattr(host_threads, "NATIVE_FLOPS_PER_THREAD", 1)
    monkeypatch.setattr(host_threads, "backing_off", lambda: False)
    runs = []
    run = product_pool.run
    monkeypatch.setattr(product_pool, "run",
                        lambda x, y, out, *a: runs.append(out.base is not None) or run(
                            x, y, out, *a))
    got = np.asarray(conv_general_dilated(x, w, (1, 1), padding))
    assert runs == [True] * 4  # into views of the result, not new arrays
    assert got.tobytes() == one.tobytes()
    np.testing.assert_allclose(got, naive_conv(x, w, (1, 1), padding, (1, 1), (1, 1), 1),
                               rtol=1e-4, atol=1e-4)


def test_conv_patches_stay_whole_where_blocks_would_repack_large_filters(monkeypatch):
    # 64 images of 4x4 output pixels, 3x3x16 -> 128 filters (72 KB): 576
    # KB of patches, less than two blocks of 8 filter copies (576 KB
    # each): they stay whole, where blocks would repack the filters for
    # every 8 images.
    from keras_ipu.device.primitives import conv

    x = RNG.standard_normal((64, 16, 6, 6)).astype(np.float32)
    w = RNG.standard_normal((128, 16, 3, 3)).astype(np.float32)
    monkeypatch.setattr(conv, "PATCH_BLOCK_BYTES", 1)
    blocked = []
    real = conv._blocked_im2col_product
    monkeypatch.setattr(conv, "_blocked_im2col_product",
                        lambda win, *args: blocked.append(args[-2]) or real(win, *args))
    got = np.asarray(conv_general_dilated(x, w, (1, 1), ((0, 0), (0, 0))))
    assert blocked == []
    monkeypatch.setattr(conv, "FILTER_REPACKS_PER_BLOCK", 1)
    again = np.asarray(conv_general_dilated(x, w, (1, 1), ((0, 0), (0, 0))))
    assert blocked and blocked[0] == w.nbytes
    want = naive_conv(x, w, (1, 1), ((0, 0), (0, 0)), (1, 1), (1, 1), 1)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(again, want, rtol=1e-4, atol=1e-4)


# Windows larger than their outputs (weight gradients: x is the forward
# input with batch and channels swapped, w the output gradient).
LARGE_WINDOW_CASES = [
    # (spatial, window, strides, padding, rhs_dil)
    ((9, 8), (7, 6), (1, 1), ((1, 1), (1, 1)), (1, 1)),
    ((9, 9), (5, 5), (1, 1), ((0, 1), (0, 1)), (2, 2)),  # a forward stride of 2
    ((9, 8), (5, 6), (2, 1), ((1, 1), (1, 1)), (1, 1)),  # a forward dilation of 2
    ((8, 7), (6, 6), (1, 1), ((-1, 1), (0, 0)), (1, 1)),
    ((12,), (9,), (1,), ((1, 2),), (1,)),
    ((5, 4, 6), (4, 3, 5), (1, 1, 1), ((0, 0), (0, 0), (0, 0)), (1, 1, 1)),
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", LARGE_WINDOW_CASES, ids=lambda c: f"{len(c[0])}d-{c[1]}")
def test_weight_gradients_in_image_blocks_match_the_reference_on_any_threads(
        case, dtype, monkeypatch):
    # One block per image of the forward batch (7), partial products summed
    # in block order: the same bits on one thread and on three.
    from keras_ipu.device.native import threads as host_threads
    from keras_ipu.device.primitives import conv

    spatial, window, strides, padding, rd = case
    x = RNG.standard_normal((4, 7) + spatial).astype(dtype)
    w = RNG.standard_normal((5, 7) + window).astype(dtype)
    want = naive_conv(x, w, strides, padding, (1,) * len(spatial), rd, 1)
    assert np.prod(want.shape[2:]) < np.prod(window)
    monkeypatch.setattr(conv, "PATCH_BLOCK_BYTES", 1)
    monkeypatch.setattr(conv, "FILTER_REPACKS_PER_BLOCK", 0)
    monkeypatch.setattr(host_threads, "FLOPS_PER_THREAD", 1)
    monkeypatch.setattr(conv, "_large_window_conv", None)  # never reached
    splits, got = [], {}
    real = host_threads.parallel_for
    monkeypatch.setattr(host_threads, "parallel_for",
                        lambda fn, count, n: splits.append((count, n)) or real(fn, count, n))
    for cap in (1, 3):
        monkeypatch.setattr(host_threads, "_cap", cap)
        got[cap] = np.asarray(conv_general_dilated(x, w, strides, padding, None, rd))
    assert splits == [(7, 1), (7, 3)]
    assert got[1].dtype == dtype and got[1].tobytes() == got[3].tobytes()
    np.testing.assert_allclose(got[3], want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("inputs, kernel", [
    ((4, 0, 9, 8), (5, 0, 3, 3)),  # no input channels
    ((0, 3, 9, 8), (5, 3, 3, 3)),  # no images (Keras' layer tests build empty batches)
    ((4, 3, 9, 8), (0, 3, 3, 3)),  # no output channels
], ids=["channels", "images", "filters"])
def test_empty_convolutions_and_their_gradients_are_zeros_of_their_shapes(
        inputs, kernel, monkeypatch):
    # A weight gradient's image blocks sized their step by the patches'
    # bytes per image: 0 with no input channels (a ZeroDivisionError).
    # Blocks of one image each here; eager and compiled.
    from keras_ipu.backend import numpy as knp
    from keras_ipu.device import autodiff
    from keras_ipu.device.compiler import ExecutableCache
    from keras_ipu.device.jit import jit
    from keras_ipu.device.primitives import conv

    monkeypatch.setattr(conv, "PATCH_BLOCK_BYTES", 1)
    monkeypatch.setattr(conv, "FILTER_REPACKS_PER_BLOCK", 0)
    x = RNG.standard_normal(inputs).astype(np.float32)
    w = RNG.standard_normal(kernel).astype(np.float32)
    padding = ((0, 0), (0, 0))

    def step(x, w):
        def loss(x, w):
            return knp.sum(knp.multiply(conv_general_dilated(x, w, (1, 1), padding), 2.0))

        return (conv_general_dilated(x, w, (1, 1), padding),
                *autodiff.grad(loss, argnums=(0, 1))(x, w))

    out_shape = (inputs[0], kernel[0], 7, 6)  # 3x3 windows over 9x8
    for y, gx, gw in (step(x, w), jit(step, cache=ExecutableCache())(x, w)):
        for got, shape in ((y, out_shape), (gx, inputs), (gw, kernel)):
            got = np.asarray(got)
            assert got.shape == shape and got.dtype == np.float32
            assert not got.any()
    # The weight gradient's own form (forward channels and batch swapped):
    # nothing to block, one (empty) product.
    swapped = np.moveaxis(x, 1, 0)  # C, N, H, W
    grads = np.zeros((kernel[0], inputs[0], 7, 6), np.float32)  # O, N, *P
    assert conv._weight_gradient_in_image_blocks(
        swapped, grads, (3, 3), (1, 1), padding, (1, 1)) is None


def test_weight_gradient_of_one_block_runs_as_one_product(monkeypatch):
    # Patches smaller than a block: no pool, no partial sums.
    from keras_ipu.device.primitives import conv

    x = RNG.standard_normal((4, 7, 9, 8)).astype(np.float32)
    w = RNG.standard_normal((5, 7, 7, 6)).astype(np.float32)
    padding = ((1, 1), (1, 1))
    ones = []
    real = conv._large_window_conv
    monkeypatch.setattr(conv, "_large_window_conv",
                        lambda *args: ones.append(args[2]) or real(*args))
    got = np.asarray(conv_general_dilated(x, w, (1, 1), padding))
    assert ones == [(5, 5)]
    want = naive_conv(x, w, (1, 1), padding, (1, 1), (1, 1), 1)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.skipif(native.im2col is None, reason="the _im2col extension is not built")
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("geometry", [
    ((9, 8), (3, 3), (1, 1), (1, 1)),
    ((11, 10), (3, 2), (2, 3), (1, 1)),
    ((12, 11), (2, 3), (1, 2), (2, 3)),
], ids=str)
def test_conv_patch_copy_in_c_matches_numpys(geometry, dtype, monkeypatch):
    # Channels-last padded images: the C copy of a block of images' patches
    # holds what NumPy's copy of the window view holds, and a convolution
    # through it (patches in blocks) matches the naive reference.
    from keras_ipu.device.primitives import conv

    spatial, ksize, strides, dilation = geometry
    x_nhwc = RNG.standard_normal((5,) + spatial + (3,)).astype(dtype)
    x = np.moveaxis(x_nhwc, -1, 1)  # N, C, H, W over channels-last memory
    w = RNG.standard_normal((4, 3) + ksize).astype(dtype)
    padding = ((1, 0), (0, 1))
    xp = np.pad(x_nhwc, ((0, 0),) + padding + ((0, 0),))
    span = tuple((k - 1) * d + 1 for k, d in zip(ksize, dilation))
    win = np.lib.stride_tricks.sliding_window_view(xp, span, axis=(1, 2))
    win = np.moveaxis(win[:, ::strides[0], ::strides[1], :, ::dilation[0], ::dilation[1]], 3, -1)
    copy = conv._patch_copy(xp, win, ksize, strides, dilation)
    block = np.full((2,) + win.shape[1:], np.nan, dtype)
    copy(2, 4, block)
    assert block.tobytes() == np.ascontiguousarray(win[2:4]).tobytes()
    # Too small a block: refused by C, copied by NumPy's broadcast error.
    with pytest.raises(ValueError):
        copy(2, 5, block)

    monkeypatch.setattr(conv, "PATCH_BLOCK_BYTES", 1)
    monkeypatch.setattr(conv, "FILTER_REPACKS_PER_BLOCK", 0)
    calls = []
    monkeypatch.setattr(native, "im2col", type("Counting", (), {"patches": staticmethod(
        lambda *args: calls.append(args[2:4]) or real_patches(*args))}))
    got = np.asarray(conv_general_dilated(x, w, strides, padding, None, dilation))
    assert calls == [(n, n + 1) for n in range(5)]
    want = naive_conv(x, w, strides, padding, (1, 1), dilation, 1)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


real_patches = native.im2col.patches if native.im2col is not None else None


@pytest.mark.skipif(native.im2col is None, reason="the _im2col extension is not built")
def test_conv_patch_copy_in_c_refuses_buffers_that_do_not_fit():
    xp = RNG.standard_normal((2, 5, 5, 3)).astype(np.float32)
    dst = np.full((2, 3, 3, 3, 3, 3), 7.0, np.float32)
    patches = native.im2col.patches
    assert patches(xp, dst, 0, 2, 5, 5, 3, 3, 3, 3, 3, 1, 1, 1, 1) is True
    dst[...] = 7.0
    assert patches(xp, dst, 0, 2, 5, 5, 3, 4, 3, 3, 3, 1, 1, 1, 1) is False  # reads past H
    assert patches(xp, dst, 1, 3, 5, 5, 3, 3, 3, 3, 3, 1, 1, 1, 1) is False  # past N
    assert patches(xp, dst[:1], 0, 2, 5, 5, 3, 3, 3, 3, 3, 1, 1, 1, 1) is False
    assert patches(xp.astype(np.float64), dst, 0, 2, 5, 5, 3, 3, 3, 3, 3, 1, 1, 1, 1) is False
    assert patches(xp[:, ::2], dst, 0, 2, 5, 5, 3, 3, 3, 3, 3, 1, 1, 1, 1) is False
    assert (dst == 7.0).all()


def test_conv_channels_last_layout_and_same_padding():
    x = RNG.standard_normal((2, 7, 5, 4)).astype(np.float32)  # NHWC
    w = RNG.standard_normal((3, 2, 4, 6)).astype(np.float32)  # HWIO
    dn = ((0, 3, 1, 2), (3, 2, 0, 1), (0, 3, 1, 2))
    got = conv_general_dilated(x, w, (2, 2), "SAME", dimension_numbers=dn)
    # SAME, stride 2: out = ceil(in / 2), pad total = (out-1)*2 + k - in:
    # H: 7 -> 4, total 2 -> (1, 1); W: 5 -> 3, total 1 -> (0, 1).
    want = naive_conv(x.transpose(0, 3, 1, 2), w.transpose(3, 2, 0, 1),
                      (2, 2), ((1, 1), (0, 1)), (1, 1), (1, 1), 1)
    np.testing.assert_allclose(np.asarray(got), want.transpose(0, 2, 3, 1),
                               rtol=1e-4, atol=1e-4)


def test_conv_transpose_is_the_adjoint_of_conv():
    # <conv(x, w), y> == <x, conv_transpose(y, flipped w)>
    x = RNG.standard_normal((1, 2, 9)).astype(np.float64)
    w = RNG.standard_normal((3, 2, 4)).astype(np.float64)
    y_shape = naive_conv(x, w, (2,), ((0, 0),), (1,), (1,), 1).shape
    y = RNG.standard_normal(y_shape)
    fwd = np.asarray(conv_general_dilated(x, w, (2,), ((0, 0),)))
    w_t = np.flip(w, 2).transpose(1, 0, 2)
    back = np.asarray(conv_transpose(y, w_t, (2,), ((3, 4),)))
    assert back.shape == x.shape
    np.testing.assert_allclose((fwd * y).sum(), (x * back).sum(), rtol=1e-10)


def test_conv_integer_and_half_dtypes():
    x = RNG.integers(-3, 4, (1, 2, 5)).astype(np.int32)
    w = RNG.integers(-3, 4, (2, 2, 2)).astype(np.int32)
    got = conv_general_dilated(x, w, (1,), ((0, 0),))
    assert got.dtype == np.int32
    np.testing.assert_array_equal(
        np.asarray(got), naive_conv(x, w, (1,), ((0, 0),), (1,), (1,), 1))
    got16 = conv_general_dilated(x.astype(np.float16), w.astype(np.float16),
                                 (1,), ((0, 0),))
    assert got16.dtype == np.float16


def test_conv_shape_rule_agrees_with_kernel_and_accepts_none():
    x = RNG.standard_normal((2, 4, 9, 8)).astype(np.float32)
    w = RNG.standard_normal((6, 2, 3, 3)).astype(np.float32)
    params = dict(window_strides=(2, 1), padding=((1, 1), (0, 2)),
                  lhs_dilation=(1, 1), rhs_dilation=(1, 2),
                  dimension_numbers=((0, 1, 2, 3),) * 3, feature_group_count=2)
    out = conv_general_dilated_p.bind(x, w, **params)
    rule = conv_general_dilated_p.shape_rule(
        ShapedArray(x.shape, x.dtype), ShapedArray(w.shape, w.dtype), **params)
    assert rule == ShapedArray(out.shape, out.dtype)
    builder = GraphBuilder()
    tx = builder.new_input(ShapedArray((None, 4, None, 8), np.float32))
    traced = conv_general_dilated_p.bind(tx, w, **params)
    assert traced.shape == (None, 6, None, out.shape[3])
    assert builder.graph.nodes[-1].primitive is conv_general_dilated_p


def test_conv_rejects_mismatched_channels():
    x = np.zeros((1, 5, 4), np.float32)
    w = np.zeros((2, 2, 3), np.float32)
    with pytest.raises(ValueError, match="5 channels"):
        conv_general_dilated_p.shape_rule(
            ShapedArray(x.shape, x.dtype), ShapedArray(w.shape, w.dtype),
            window_strides=(1,), padding=((0, 0),), lhs_dilation=(1,),
            rhs_dilation=(1,), dimension_numbers=((0, 1, 2),) * 3,
            feature_group_count=2)


def naive_reduce_window(x, op, window, strides, padding):
    fill = {"max": -np.inf, "min": np.inf, "sum": 0.0}[op]
    fn = {"max": np.max, "min": np.min, "sum": np.sum}[op]
    x = _pad(x.astype(np.float64), tuple(range(x.ndim)), padding, fill)
    out_shape = [(n - k) // s + 1 for n, k, s in zip(x.shape, window, strides)]
    out = np.zeros(out_shape)
    for p in itertools.product(*[range(q) for q in out_shape]):
        idx = tuple(slice(pp * s, pp * s + k)
                    for pp, s, k in zip(p, strides, window))
        out[p] = fn(x[idx])
    return out


@pytest.mark.parametrize("op", ["max", "sum", "min"])
@pytest.mark.parametrize(
    "shape,window,strides,padding",
    [
        ((2, 9, 3), (1, 3, 1), (1, 2, 1), ((0, 0), (0, 0), (0, 0))),
        ((2, 7, 6, 3), (1, 2, 3, 1), (1, 2, 2, 1),
         ((0, 0), (0, 1), (1, 1), (0, 0))),
        ((1, 2, 5, 4, 6), (1, 1, 2, 2, 3), (1, 1, 1, 2, 3),
         ((0, 0), (0, 0), (1, 0), (0, 1), (1, 1))),
    ],
)
def test_reduce_window_matches_naive_reference(op, shape, window, strides,
                                               padding):
    x = RNG.standard_normal(shape).astype(np.float32)
    got = reduce_window(x, op, window, strides, padding)
    want = naive_reduce_window(x, op, window, strides, padding)
    assert got.shape == want.shape and got.dtype == np.float32
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)


def naive_select_and_scatter_add(g, x, y, op, window, strides, padding):
    """Window by window (output order): the window's first element, in
    row-major order, equal to its result takes its cotangent; padding is
    never picked."""
    fill = {"max": -np.inf, "min": np.inf}[op]
    xp = _pad(x.astype(np.float64), tuple(range(x.ndim)), padding, fill)
    real = _pad(np.ones(x.shape), tuple(range(x.ndim)), padding, 0) > 0
    acc = np.zeros(xp.shape)
    for p in itertools.product(*[range(q) for q in y.shape]):
        corner = [pp * s for pp, s in zip(p, strides)]
        for tap in itertools.product(*[range(k) for k in window]):
            at = tuple(c + t for c, t in zip(corner, tap))
            if real[at] and xp[at] == y[p]:
                acc[at] += g[p]
                break
    return acc[tuple(slice(lo, lo + n) for (lo, _), n in zip(padding, x.shape))]


# (shape, window, strides, padding): non-overlapping, overlapping with
# padding, a 1-d window, three windowed axes apart.
SCATTER_CASES = [
    ((2, 6, 6, 3), (1, 2, 2, 1), (1, 2, 2, 1), ((0, 0),) * 4),
    ((2, 7, 6, 3), (1, 3, 3, 1), (1, 2, 1, 1), ((0, 0), (1, 1), (0, 1), (0, 0))),
    ((3, 9), (1, 3), (1, 2), ((0, 0), (1, 1))),
    ((4, 2, 5, 4, 3), (2, 1, 2, 2, 1), (2, 1, 1, 2, 1), ((0, 0),) * 5),
]


@pytest.mark.parametrize("op", ["max", "min"])
@pytest.mark.parametrize("case", SCATTER_CASES, ids=lambda c: str(c[0]))
def test_select_and_scatter_add_matches_naive_reference_with_ties(op, case):
    shape, window, strides, padding = case
    # Few distinct values: most windows hold ties. Integer cotangents:
    # every sum is exact, so the order of overlapping windows' sums
    # cannot hide a wrong pick.
    x = RNG.integers(0, 3, shape).astype(np.float32)
    y = np.asarray(reduce_window(x, op, window, strides, padding))
    g = RNG.integers(-4, 5, y.shape).astype(np.float32)
    got = np.asarray(select_and_scatter_add(g, x, y, op, window, strides, padding,
                                            (1,) * len(shape)))
    assert got.shape == x.shape and got.dtype == np.float32
    np.testing.assert_array_equal(got, naive_select_and_scatter_add(
        g, x, y, op, window, strides, padding))


@pytest.mark.parametrize("op", ["max", "min"])
def test_select_and_scatter_add_never_picks_padding(op):
    # Windows whose result is the padding value itself (-inf for max):
    # their first real element holding it takes the cotangent, as XLA's
    # select-and-scatter and TensorFlow's MaxPoolGrad do.
    shape, window, strides, padding = SCATTER_CASES[1]
    x = RNG.integers(0, 3, shape).astype(np.float32)
    x[:, :3, :3, :] = -np.inf if op == "max" else np.inf
    y = np.asarray(reduce_window(x, op, window, strides, padding))
    g = RNG.integers(1, 5, y.shape).astype(np.float32)
    got = np.asarray(select_and_scatter_add(g, x, y, op, window, strides, padding,
                                            (1,) * len(shape)))
    np.testing.assert_array_equal(got, naive_select_and_scatter_add(
        g, x, y, op, window, strides, padding))
    # Nothing is lost to padding: every window's cotangent lands.
    assert got.sum() == g.sum()


def test_select_and_scatter_add_half_floats_sum_in_float32_and_keep_signed_zeros():
    # Three overlapping windows pick the same element; summed in float16
    # 2048 + 1 rounds back to 2048 (twice), in float32 the sum is 2050.
    x = np.array([[0.0, 0.0, 5.0, 0.0, 0.0]], np.float16)
    y = np.asarray(reduce_window(x, "max", (1, 3), (1, 1)))
    g = np.array([[1.0, 1.0, 2048.0]], np.float16)
    got = np.asarray(select_and_scatter_add(g, x, y, "max", (1, 3), (1, 1),
                                            ((0, 0), (0, 0)), (1, 1)))
    assert got.dtype == np.float16
    np.testing.assert_array_equal(got, [[0, 0, 2050, 0, 0]])
    # Non-overlapping windows write each share as it is: -0.0 stays -0.0,
    # as the concatenate of the per-tap pads gave.
    x = np.array([[1.0, 0.0, 0.0, 1.0]], np.float32)
    y = np.asarray(reduce_window(x, "max", (1, 2), (1, 2)))
    got = np.asarray(select_and_scatter_add(np.array([[-0.0, -0.0]], np.float32), x, y,
                                            "max", (1, 2), (1, 2), ((0, 0), (0, 0)),
                                            (1, 1)))
    assert np.signbit(got[0, 0]) and np.signbit(got[0, 3])


def test_select_and_scatter_add_matches_jaxs_max_pool_gradient():
    jax = pytest.importorskip("jax")
    x = RNG.integers(0, 4, (2, 7, 8, 3)).astype(np.float32)
    window, strides = (1, 3, 2, 1), (1, 2, 2, 1)
    padding = ((0, 0), (1, 1), (0, 0), (0, 0))

    def pool(v):
        return jax.lax.reduce_window(v, -np.inf, jax.lax.max, window, strides, padding)

    y, vjp = jax.vjp(pool, x)
    g = RNG.integers(-3, 4, y.shape).astype(np.float32)
    got = select_and_scatter_add(g, x, np.asarray(y), "max", window, strides, padding,
                                 (1,) * 4)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(vjp(g)[0]))


def test_select_and_scatter_add_shape_rule_checks_its_operands():
    from keras_ipu.device.primitives.pooling import select_and_scatter_add_p
    from keras_ipu.device.primitives.shape_rules import ShapeError

    def rule(g, x, y, op="max"):
        return select_and_scatter_add_p.shape_rule(
            ShapedArray(g, np.float32), ShapedArray(x, np.float32),
            ShapedArray(y, np.float32), op=op, window_dimensions=(1, 2, 2, 1),
            window_strides=(1, 2, 2, 1), padding=((0, 0),) * 4, window_dilation=(1,) * 4)

    assert rule((1, 2, 2, 1), (1, 4, 4, 1), (1, 2, 2, 1)) == ShapedArray((1, 4, 4, 1),
                                                                           np.float32)
    assert rule((None, 2, 2, 1), (None, 4, 4, 1), (None, 2, 2, 1)).shape == (None, 4, 4, 1)
    with pytest.raises(ShapeError, match="cotangent"):
        rule((1, 3, 2, 1), (1, 4, 4, 1), (1, 2, 2, 1))
    with pytest.raises(ShapeError, match="window results"):
        rule((1, 3, 3, 1), (1, 4, 4, 1), (1, 3, 3, 1))
    with pytest.raises(ValueError, match="op='sum'"):
        rule((1, 2, 2, 1), (1, 4, 4, 1), (1, 2, 2, 1), op="sum")


def test_reduce_window_same_padding_and_int_identity():
    x = np.arange(-10, 10, dtype=np.int32).reshape(1, 20)
    got = reduce_window(x, "max", (1, 3), (1, 2), "SAME")
    # SAME, stride 2, window 3 on 20: out 10, total pad 1 -> (0, 1).
    want = naive_reduce_window(x, "max", (1, 3), (1, 2), ((0, 0), (0, 1)))
    assert got.dtype == np.int32
    np.testing.assert_array_equal(np.asarray(got), want)


def test_reduce_window_shape_rule_accepts_none():
    params = dict(op="max", window_dimensions=(1, 2, 2, 1),
                  window_strides=(1, 2, 2, 1),
                  padding=((0, 0), (0, 1), (0, 0), (0, 0)),
                  base_dilation=(1,) * 4, window_dilation=(1,) * 4)
    x = RNG.standard_normal((3, 5, 6, 2)).astype(np.float32)
    out = reduce_window_p.bind(x, **params)
    assert reduce_window_p.shape_rule(
        ShapedArray(x.shape, x.dtype), **params
    ) == ShapedArray(out.shape, out.dtype)
    builder = GraphBuilder()
    tx = builder.new_input(ShapedArray((None, 5, None, 2), np.float32))
    assert reduce_window_p.bind(tx, **params).shape == (None, 3, None, 2)


def test_same_padding_with_unknown_size_is_resolved_when_run():
    # Traced with an unknown length, a strided SAME padding stays "SAME" in
    # the params; the kernel resolves it from the actual shape.
    w = RNG.standard_normal((4, 3, 3)).astype(np.float32)
    builder = GraphBuilder()
    tx = builder.new_input(ShapedArray((2, 3, None), np.float32))
    traced = conv_general_dilated(tx, w, (2,), "SAME")
    assert traced.shape == (2, 4, None)
    params = builder.graph.nodes[-1].params
    assert params["padding"] == ("SAME",)
    x = RNG.standard_normal((2, 3, 8)).astype(np.float32)
    got = conv_general_dilated_p.bind(x, w, **params)
    # 8 -> ceil(8 / 2) = 4 outputs, total pad (4-1)*2 + 3 - 8 = 1 -> (0, 1).
    want = naive_conv(x, w, (2,), ((0, 1),), (1,), (1,), 1)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)

    tp = builder.new_input(ShapedArray((None, 7), np.float32))
    pooled = reduce_window(tp, "max", (1, 3), (1, 2), "SAME")
    assert pooled.shape == (None, 4)
    tq = builder.new_input(ShapedArray((2, None), np.float32))
    pooled = reduce_window(tq, "max", (1, 3), (1, 2), "SAME")
    assert pooled.shape == (2, None)
    rw_params = builder.graph.nodes[-1].params
    assert rw_params["padding"] == ((0, 0), "SAME")
    y = RNG.standard_normal((2, 7)).astype(np.float32)
    np.testing.assert_allclose(
        np.asarray(reduce_window_p.bind(y, **rw_params)),
        naive_reduce_window(y, "max", (1, 3), (1, 2), ((0, 0), (1, 1))))


# -- native/_pooling.c: the gradient over windows that do not overlap in one
# pass, against the NumPy kernel it replaces (the same bits) and the naive
# window loop above.

_needs_c_pooling = pytest.mark.skipif(
    native.pooling is None, reason="the _pooling extension is not built or turned off")

# (shape, window, strides): windows that tile the operand (channels last
# and channels first), a remainder no window covers, windows apart
# (stride > window), a 1-d pool, every axis windowed.
DISJOINT = [
    ((3, 8, 6, 5), (1, 2, 2, 1), (1, 2, 2, 1)),
    ((2, 3, 6, 8), (1, 1, 2, 2), (1, 1, 2, 2)),
    ((2, 7, 9, 4), (1, 2, 2, 1), (1, 2, 2, 1)),
    ((2, 10, 11, 3), (1, 2, 3, 1), (1, 3, 4, 1)),
    ((4, 9, 300), (1, 3, 1), (1, 3, 1)),
    ((6, 4, 6), (2, 2, 3), (2, 2, 3)),
]


def _bits(a):
    return np.asarray(a).view(np.uint32 if a.dtype == np.float32 else np.uint64)


def _numpy_path(monkeypatch, g, x, y, op, window, strides):
    with monkeypatch.context() as m:
        m.setattr(native, "pooling", None)
        return np.asarray(select_and_scatter_add(g, x, y, op, window, strides,
                                                 ((0, 0),) * x.ndim, (1,) * x.ndim))


def _operands(shape, window, strides, op, dtype):
    # Few distinct values (most windows hold ties), NaNs (a NaN window
    # picks nothing), infinities, and -0.0 cotangents (kept as -0.0).
    x = RNG.integers(0, 3, shape).astype(dtype)
    flat = x.reshape(-1)
    flat[RNG.choice(flat.size, 4, replace=False)] = np.nan
    flat[RNG.choice(flat.size, 4, replace=False)] = np.inf if op == "max" else -np.inf
    y = np.asarray(reduce_window(x, op, window, strides, ((0, 0),) * x.ndim))
    g = RNG.integers(-4, 5, y.shape).astype(dtype)
    g.reshape(-1)[RNG.choice(g.size, min(g.size, 5), replace=False)] = -0.0
    return g, x, y


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("op", ["max", "min"])
@pytest.mark.parametrize("case", DISJOINT, ids=lambda c: str(c[0]))
@_needs_c_pooling
def test_one_pass_gradient_has_the_numpy_kernels_bits(monkeypatch, case, op, dtype):
    shape, window, strides = case
    g, x, y = _operands(shape, window, strides, op, dtype)
    taken = []
    real = native.pooling

    class Recording:
        @staticmethod
        def select_tiled(*args):
            taken.append(real.select_tiled(*args))
            return taken[-1]

    monkeypatch.setattr(native, "pooling", Recording)
    got = np.asarray(select_and_scatter_add(g, x, y, op, window, strides,
                                            ((0, 0),) * x.ndim, (1,) * x.ndim))
    assert taken == [True]
    want = _numpy_path(monkeypatch, g, x, y, op, window, strides)
    assert got.dtype == want.dtype == np.dtype(dtype)
    assert got.tobytes() == want.tobytes()
    naive = naive_select_and_scatter_add(g, x, y, op, window, strides,
                                         ((0, 0),) * x.ndim)
    np.testing.assert_array_equal(got, naive)
    assert np.signbit(got[got == 0]).any() == np.signbit(want[want == 0]).any()


@_needs_c_pooling
def test_a_split_over_the_c_pool_has_the_same_bits(monkeypatch):
    shape, window, strides = (8, 32, 32, 16), (1, 2, 2, 1), (1, 2, 2, 1)
    g, x, y = _operands(shape, window, strides, "max", np.float32)
    want = _numpy_path(monkeypatch, g, x, y, "max", window, strides)
    notes = []
    monkeypatch.setattr(pooling, "_row_threads", lambda cells, rows, streams: 2)
    monkeypatch.setattr(pooling.host_threads, "backing_off", lambda: False)
    monkeypatch.setattr(pooling.host_threads, "note_pool_split",
                        lambda done, count, threads=None: notes.append((done, count)))
    got = np.asarray(select_and_scatter_add(g, x, y, "max", window, strides,
                                            ((0, 0),) * 4, (1,) * 4))
    assert got.tobytes() == want.tobytes()
    # Two tasks per thread, each its own rows of y; the pool's report
    # (tasks the caller ran, its seconds, its wait) goes to the back-off.
    assert [count for _, count in notes] == [4]
    ran, own, wait = notes[0][0]
    assert 0 <= ran <= 4 and own >= 0 and wait >= 0


@pytest.mark.parametrize("case", [
    ((2, 7, 6, 3), (1, 3, 3, 1), (1, 2, 2, 1), ((0, 0),) * 4),  # overlapping
    ((2, 6, 6, 3), (1, 2, 2, 1), (1, 2, 2, 1), ((0, 0), (1, 1), (0, 0), (0, 0))),  # padded
], ids=["overlapping", "padded"])
@_needs_c_pooling
def test_overlapping_or_padded_windows_keep_the_numpy_kernel(monkeypatch, case):
    shape, window, strides, padding = case

    class Refusing:
        @staticmethod
        def select_tiled(*args):
            raise AssertionError("the one-pass kernel took windows it does not cover")

    x = RNG.integers(0, 3, shape).astype(np.float32)
    y = np.asarray(reduce_window(x, "max", window, strides, padding))
    g = RNG.integers(-4, 5, y.shape).astype(np.float32)
    monkeypatch.setattr(native, "pooling", Refusing)
    got = np.asarray(select_and_scatter_add(g, x, y, "max", window, strides, padding,
                                            (1,) * 4))
    np.testing.assert_array_equal(got, naive_select_and_scatter_add(
        g, x, y, "max", window, strides, padding))


@_needs_c_pooling
def test_half_floats_and_refused_buffers_fall_back(monkeypatch):
    # float16 is not the C kernel's: the NumPy kernel runs (and sums in
    # float32); a C call that refuses its buffers writes nothing.
    shape, window, strides = DISJOINT[0]
    x = RNG.integers(0, 3, shape).astype(np.float16)
    y = np.asarray(reduce_window(x, "max", window, strides, ((0, 0),) * 4))
    g = RNG.integers(-4, 5, y.shape).astype(np.float16)
    got = select_and_scatter_add(g, x, y, "max", window, strides, ((0, 0),) * 4, (1,) * 4)
    np.testing.assert_array_equal(np.asarray(got), naive_select_and_scatter_add(
        g, x, y, "max", window, strides, ((0, 0),) * 4))

    x32, y32, g32 = (a.astype(np.float32) for a in (x, y, g))
    out = np.full(x.shape, 7.0, np.float32)
    lead = np.array(y.shape[:3], np.int64)
    steps = np.array([8 * 6 * 5, 2 * 6 * 5, 2 * 5], np.int64)
    taps = np.array([0, 5, 30, 35], np.int64)
    call = native.pooling.select_tiled
    assert call(g32, x32, y32, out, 5, lead, steps, taps) is True
    np.testing.assert_array_equal(out, _numpy_path(monkeypatch, g32, x32, y32, "max",
                                                   window, strides))
    out[...] = 7.0
    assert call(g32, x32.astype(np.float64), y32, out, 5, lead, steps, taps) is False
    assert call(g32, x32, y32, out[:-1], 5, lead, steps, taps) is False  # too small
    assert call(g32, x32, y32, out, 5, lead, steps, taps + 1) is False  # past the end
    assert call(g32, x32, y32, out, 5, lead, steps, taps.astype(np.int32)) is False
    # Buffers that do not fit before the last (held ones released), a
    # read-only out, and the window results' kernel on the same refusals.
    assert call(g32, np.asfortranarray(x32), y32, out, 5, lead, steps, taps) is False
    frozen = out.copy()
    frozen.flags.writeable = False
    assert call(g32, x32, y32, frozen, 5, lead, steps, taps) is False
    reduce = native.pooling.reduce_max
    short = out.reshape(-1)[:y32.size - 1]
    assert reduce(x32, short, 5, lead, steps, taps, False) is False
    assert reduce(x32, frozen.reshape(-1)[:y32.size], 5, lead, steps, taps, False) is False
    with pytest.raises(ValueError):
        reduce(x32, np.empty_like(y32), 5, lead, steps, taps, False, 2, 0)
    assert (out == 7.0).all()


# (shape, window, strides, window dilation): tiled, overlapping (3x3 of
# stride 2), dilated, channels first, every axis windowed, a remainder.
UNPADDED_WINDOWS = [
    ((3, 8, 6, 5), (1, 2, 2, 1), (1, 2, 2, 1), (1, 1, 1, 1)),
    ((2, 9, 7, 4), (1, 3, 3, 1), (1, 2, 2, 1), (1, 1, 1, 1)),
    ((2, 9, 8, 3), (1, 2, 3, 1), (1, 1, 2, 1), (1, 3, 2, 1)),
    ((2, 3, 6, 8), (1, 1, 2, 2), (1, 1, 2, 2), (1, 1, 1, 1)),
    ((6, 5, 7), (2, 2, 3), (2, 1, 3), (1, 1, 1)),
]


@_needs_c_pooling
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("op", ["max", "min"])
@pytest.mark.parametrize("case", UNPADDED_WINDOWS, ids=lambda c: f"{c[0]}-{c[1]}")
def test_one_pass_window_extremum_matches_numpys(monkeypatch, case, op, dtype):
    shape, window, strides, dilation = case
    x = RNG.integers(-3, 3, shape).astype(dtype)
    flat = x.reshape(-1)
    flat[RNG.choice(flat.size, 5, replace=False)] = np.nan
    flat[RNG.choice(flat.size, 5, replace=False)] = np.inf
    flat[RNG.choice(flat.size, 5, replace=False)] = -np.inf
    flat[flat == 0] = RNG.choice([0.0, -0.0], int((flat == 0).sum()))
    taken = []
    real = native.pooling

    class Recording:
        @staticmethod
        def reduce_max(*args):
            taken.append(real.reduce_max(*args))
            return taken[-1]

    monkeypatch.setattr(native, "pooling", Recording)
    params = dict(op=op, window_dimensions=window, window_strides=strides,
                  padding=((0, 0),) * x.ndim, base_dilation=(1,) * x.ndim,
                  window_dilation=dilation)
    got = np.asarray(reduce_window_p.bind(x, **params))
    assert taken == [True]
    monkeypatch.setattr(native, "pooling", None)
    want = np.asarray(reduce_window_p.bind(x, **params))
    assert got.shape == want.shape and got.dtype == want.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(got, want)  # NaN where NumPy's is NaN


@_needs_c_pooling
def test_padded_or_integer_windows_keep_the_numpy_extremum(monkeypatch):
    class Refusing:
        @staticmethod
        def reduce_max(*args):
            raise AssertionError("the one-pass kernel took windows it does not cover")

    monkeypatch.setattr(native, "pooling", Refusing)
    x = RNG.standard_normal((2, 7, 6, 3)).astype(np.float32)
    got = reduce_window(x, "max", (1, 3, 3, 1), (1, 2, 2, 1), ((0, 0), (1, 1), (1, 1), (0, 0)))
    np.testing.assert_array_equal(np.asarray(got), naive_reduce_window(
        x, "max", (1, 3, 3, 1), (1, 2, 2, 1), ((0, 0), (1, 1), (1, 1), (0, 0))))
    xi = RNG.integers(0, 9, (2, 6, 6, 3)).astype(np.int32)
    got = reduce_window(xi, "min", (1, 2, 2, 1), (1, 2, 2, 1))
    np.testing.assert_array_equal(np.asarray(got), naive_reduce_window(
        xi, "min", (1, 2, 2, 1), (1, 2, 2, 1), ((0, 0),) * 4))


@_needs_c_pooling
def test_one_pass_window_extremum_refuses_buffers_that_do_not_fit():
    x = RNG.standard_normal((2, 4, 4, 3)).astype(np.float32)
    lead = np.array([2, 2, 2], np.int64)
    steps = np.array([48, 24, 6], np.int64)
    taps = np.array([0, 3, 12, 15], np.int64)
    out = np.full((2, 2, 2, 3), 7.0, np.float32)
    reduce_max = native.pooling.reduce_max
    assert reduce_max(x, out, 3, lead, steps, taps, False) is True
    np.testing.assert_array_equal(out, naive_reduce_window(x, "max", (1, 2, 2, 1),
                                                           (1, 2, 2, 1), ((0, 0),) * 4))
    out[...] = 7.0
    assert reduce_max(x, out.astype(np.float64), 3, lead, steps, taps, False) is False
    assert reduce_max(x[:1], out, 3, lead, steps, taps, False) is False  # reads past x
    assert reduce_max(x, out[:1], 3, lead, steps, taps, False) is False
    assert (out == 7.0).all()


@pytest.mark.parametrize("dtype, value", [(np.float32, -np.inf), (np.float16, 0),
                                          (np.int32, np.iinfo(np.int32).min), (np.bool_, True),
                                          (np.float64, np.float32(-0.0))])
@pytest.mark.parametrize("shape", [(3, 4, 5), (0, 3, 2), (2, 0, 3), (1, 1, 1)])
def test_the_constant_pad_has_numpys_bytes(dtype, value, shape):
    x = (RNG.standard_normal(shape) * 5).astype(dtype)
    for pads in (((0, 0), (1, 2), (0, 3)), ((1, 0), (0, 0), (2, 2)), ((0, 0),) * 2 + ((0, 1),)):
        want = np.pad(x, pads, constant_values=value)
        got = _pad_constant(x, pads, value)
        assert got.dtype == want.dtype and got.shape == want.shape
        assert got.tobytes() == want.tobytes()
        assert got.flags.c_contiguous and not np.shares_memory(got, x)
