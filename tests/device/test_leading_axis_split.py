"""Memory-bound kernels split over axis 0 (device/native/leading_axis.py):
each lowered kernel on 3 threads against the same kernel on one, bit for
bit where every row is computed as before, within rounding for sums over
axis 0 (partial sums per block); small kernels and a cap of 1 stay whole."""

import numpy as np
import pytest

from keras_ipu.device import native
from keras_ipu.device.compiler.lowering import lower
from keras_ipu.device.ir import ShapedArray
from keras_ipu.device.native import threads
from keras_ipu.device.primitives.elementwise import add_p
from keras_ipu.device.primitives.elementwise import max_p
from keras_ipu.device.primitives.pooling import reduce_window_p
from keras_ipu.device.primitives.reduce import reduce_max_p
from keras_ipu.device.primitives.reduce import reduce_sum_p
from keras_ipu.device.primitives.structure import pad_p

RNG = np.random.default_rng(0)


def _aval(x):
    return ShapedArray(np.shape(x), np.asarray(x).dtype)


@pytest.fixture
def on_threads(monkeypatch):
    """Lower and run with a cap of `n` threads and a split from 4 elements
    per thread (`scales`: whether a second thread adds memory bandwidth);
    returns the kernel's result and the pool calls made."""

    pool = threads.parallel_for

    def run(n, prim, params, *xs, scales=True):
        monkeypatch.setattr(threads, "_cap", n)
        monkeypatch.setattr(threads, "ELEMENTS_PER_THREAD", 4)
        monkeypatch.setattr(threads, "_streaming_scales", scales)
        calls = []
        monkeypatch.setattr(threads, "parallel_for",
                            lambda fn, count, t: calls.append((count, t)) or pool(fn, count, t))
        kernel = lower(prim, params, tuple(_aval(x) for x in xs),
                       (prim.abstract_eval(*[_aval(x) for x in xs], **params),))
        return np.asarray(kernel(*xs)), calls

    return run


# A 2x2 max pool of stride 2, and one padded, which the one-pass C kernel
# does not take (it splits itself on the C pool: compiler/pooling_lowering.py).
_POOL = {"op": "max", "window_dimensions": (1, 2, 2, 1), "window_strides": (1, 2, 2, 1),
         "padding": ((0, 0),) * 4, "base_dilation": (1,) * 4, "window_dilation": (1,) * 4}
_PADDED_POOL = dict(_POOL, padding=((0, 0), (1, 0), (0, 0), (0, 0)))


def _streaming(rows):
    """(x of `rows` rows, [(primitive, params, operands)]): an add and a
    pad of x, kernels at the memory's speed."""
    x = RNG.standard_normal((rows, 5, 6, 3)).astype(np.float32)
    pad = {"config": ((0, 0, 0), (0, 1, 1), (0, 0, 0), (0, 0, 0))}
    return x, [(add_p, {}, (x, x)), (pad_p, pad, (x, np.zeros((), np.float32)))]


def _cases():
    x = RNG.standard_normal((7, 5, 6, 3)).astype(np.float32)
    row = RNG.standard_normal((1, 1, 1, 3)).astype(np.float32)
    same = RNG.standard_normal((7, 5, 6, 3)).astype(np.float32)
    small = RNG.standard_normal((7, 3, 3, 3)).astype(np.float32)
    zero = np.zeros((), np.float32)
    return {
        "add broadcast row": (add_p, {}, (x, row)),
        "add same shape": (add_p, {}, (x, same)),
        "max": (max_p, {}, (x, row)),
        # max pooling's gradient: a strided scatter into zeros
        "pad interior": (pad_p, {"config": ((0, 0, 0), (0, 1, 1), (1, 0, 1), (0, 0, 0))},
                         (small, zero)),
        "pad identity": (pad_p, {"config": ((0, 0, 0),) * 4}, (x, zero)),
        "pad edges": (pad_p, {"config": ((0, 0, 0), (2, 1, 0), (0, 0, 0), (1, 1, 0))},
                      (x, np.float32(-1.5))),
        # Pools the one-pass C kernel does not take: average, padded max.
        "sum pool": (reduce_window_p, dict(_POOL, op="sum"), (x,)),
        "padded max pool": (reduce_window_p, _PADDED_POOL, (x,)),
        "sum keeping axis 0": (reduce_sum_p, {"axes": (1, 2)}, (x,)),
        "max keeping axis 0": (reduce_max_p, {"axes": (2, 3)}, (x,)),
    }


@pytest.mark.parametrize("name", list(_cases()))
def test_split_rows_give_the_one_thread_bits(name, on_threads):
    prim, params, xs = _cases()[name]
    one, calls_one = on_threads(1, prim, params, *xs)
    got, calls = on_threads(3, prim, params, *xs)
    assert calls_one == []
    # 7 rows on 3 threads, two blocks each: blocks of 2 rows, 4 blocks.
    assert calls == [(4, 3)], calls
    assert got.shape == one.shape and got.dtype == one.dtype
    np.testing.assert_array_equal(got, one)


def test_a_batchnorm_sum_over_axis_0_adds_the_blocks_partial_sums(on_threads):
    x = RNG.standard_normal((7, 5, 6, 3)).astype(np.float32)
    params = {"axes": (0, 1, 2)}
    one, _ = on_threads(1, reduce_sum_p, params, x)
    got, calls = on_threads(3, reduce_sum_p, params, x)
    assert calls == [(4, 3)]
    assert got.shape == (3,) and got.dtype == np.float32
    # Block partial sums in row order: rows 0-1, 2-3, 4-5, 6.
    by_hand = sum(x[lo:hi].sum(axis=(0, 1, 2)) for lo, hi in ((0, 2), (2, 4), (4, 6), (6, 7)))
    np.testing.assert_allclose(got, by_hand, rtol=1e-6)
    # float32 rounding of 210 terms of magnitude ~1 (one sum cancels to -0.39)
    np.testing.assert_allclose(got, x.astype(np.float64).sum(axis=(0, 1, 2)), atol=1e-4)
    np.testing.assert_allclose(got, one, atol=1e-4)


def test_small_kernels_and_integer_sums_stay_on_one_thread(on_threads, monkeypatch):
    x = RNG.standard_normal((7, 5)).astype(np.float32)
    monkeypatch.setattr(threads, "_cap", 3)
    _, calls = on_threads(3, reduce_sum_p, {"axes": (0,)}, x.astype(np.int32))
    assert calls == []
    # 35 elements at the real threshold: one thread.
    monkeypatch.setattr(threads, "ELEMENTS_PER_THREAD", 1 << 18)
    kernel = lower(add_p, {}, (_aval(x), _aval(x)), (_aval(x),))
    assert kernel is np.add


def test_a_split_kernel_returns_a_new_array(on_threads):
    # donation.py takes a ufunc's or pad's result as the program's own
    # buffer: never a view of an operand.
    x = RNG.standard_normal((6, 4)).astype(np.float32)
    z = np.zeros((), np.float32)
    got, calls = on_threads(3, pad_p, {"config": ((0, 0, 0), (0, 0, 0))}, x, z)
    assert calls and not np.shares_memory(got, x)
    np.testing.assert_array_equal(got, x)


def test_streaming_kernels_stay_whole_where_a_second_thread_adds_no_bandwidth(on_threads):
    x, streaming = _streaming(7)
    for prim, params, xs in streaming:
        split, calls = on_threads(3, prim, params, *xs)
        assert calls == [(4, 3)]
        whole, calls = on_threads(3, prim, params, *xs, scales=False)
        assert calls == []
        np.testing.assert_array_equal(whole, split)
    # NumPy's sums (float64 here) run below the memory's speed: they split
    # anyway; the C sum over leading axes (float32) streams: its blocks
    # stay on the caller, the same blocks, so the same bits, as where it
    # splits (a timing probe must not change a sum's bits: s23det).
    _, calls = on_threads(3, reduce_sum_p, {"axes": (0, 1, 2)}, x.astype(np.float64),
                          scales=False)
    assert calls == [(4, 3)]
    whole, calls = on_threads(3, reduce_sum_p, {"axes": (0, 1, 2)}, x, scales=False)
    assert calls == [(4, 1)]
    split, calls = on_threads(3, reduce_sum_p, {"axes": (0, 1, 2)}, x)
    assert calls == [(4, 3)]
    assert whole.tobytes() == split.tobytes()


def test_the_bandwidth_probe_runs_once(monkeypatch):
    monkeypatch.setattr(threads, "_streaming_scales", None)
    first = threads.streaming_scales()
    assert isinstance(first, bool) and threads._streaming_scales is first
    monkeypatch.setattr(threads, "parallel_for", None)  # a second probe would fail
    assert threads.streaming_scales() is first


def test_streaming_kernels_split_over_at_most_four_python_threads(on_threads):
    # A 16-core host (a cap of 16): the add and the pad go to four threads
    # of the Python pool, two blocks each, where the memory's bandwidth
    # stopped growing; the NumPy max pool (not at the memory's speed, and
    # not the C kernel's: padded) takes all sixteen.
    x, streaming = _streaming(64)
    for prim, params, xs in streaming:
        split, calls = on_threads(16, prim, params, *xs)
        assert calls == [(8, 4)]
        np.testing.assert_array_equal(split, on_threads(1, prim, params, *xs)[0])
    _, calls = on_threads(16, reduce_window_p, _PADDED_POOL, x)
    assert calls == [(32, 16)]
