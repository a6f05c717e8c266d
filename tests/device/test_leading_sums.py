"""Float32 sums over leading axes in C (device/native/leading_sums.py):
NumPy's bits, NumPy's fallback where the C kernel does not apply."""

import numpy as np
import pytest

from keras_ipu.device import native
from keras_ipu.device.compiler.lowering import lower
from keras_ipu.device.ir import ShapedArray
from keras_ipu.device.native import leading_sums
from keras_ipu.device.native import threads
from keras_ipu.device.primitives.reduce import reduce_sum_p

pytestmark = pytest.mark.skipif(not native.available(), reason="C kernel not built")

RNG = np.random.default_rng(7)


def _aval(x):
    return ShapedArray(np.shape(x), np.asarray(x).dtype)


def _lowered_sum(x, axes):
    out = reduce_sum_p.abstract_eval(_aval(x), axes=axes)
    return lower(reduce_sum_p, {"axes": axes}, (_aval(x),), (out,))


def _awkward(shape):
    """Values whose sum depends on the order of the adds, with -0.0,
    infinities, NaN and values that overflow when added."""
    x = (RNG.standard_normal(shape) * np.float32(1e4)).astype(np.float32)
    flat = x.reshape(-1)
    flat[::97] = np.float32(3e38)
    flat[5::101] = -0.0
    flat[7::211] = np.inf
    flat[11::307] = -np.inf
    flat[13::401] = np.nan
    return x


@pytest.mark.parametrize("shape, axes", [
    ((64, 8, 8, 32), (0, 1, 2)),  # BatchNormalization's statistics
    ((32, 512), (0,)),  # a bias gradient
    ((5, 3, 7), (0, 1)),
    ((1, 6), (0,)),
    ((4, 3000), (-2,)),  # a negative axis
    ((3, 5000), (0,)),  # columns in more than one block
])
def test_same_bits_as_numpy(monkeypatch, shape, axes):
    monkeypatch.setattr(threads, "_cap", 1)
    x = _awkward(shape)
    kernel = _lowered_sum(x, axes)
    assert kernel.__name__ == "sum_leading_axes"
    got = kernel(x)
    with np.errstate(all="ignore"):  # the overflows are the point
        want = np.add.reduce(x, axis=axes)
    assert got.dtype == np.float32 and got.shape == want.shape
    # bit for bit: NaN payloads and the sign of zeros included
    assert got.tobytes() == want.tobytes()


def test_a_column_of_negative_zeros_sums_to_positive_zero_as_in_numpy(monkeypatch):
    monkeypatch.setattr(threads, "_cap", 1)
    x = np.full((4, 3), -0.0, np.float32)
    x[0, 1] = 1.0
    got = _lowered_sum(x, (0,))(x)
    assert got.tobytes() == np.add.reduce(x, axis=0).tobytes()
    assert not np.signbit(got).any()


def test_non_contiguous_operands_fall_back_to_numpy(monkeypatch):
    monkeypatch.setattr(threads, "_cap", 1)
    base = _awkward((6, 8))
    x = base[:, ::2]  # a strided view: the C kernel declines it
    got = _lowered_sum(x, (0,))(x)
    assert got.tobytes() == np.add.reduce(x, axis=0).tobytes()


@pytest.mark.parametrize("dtype, axes, shape", [
    (np.float64, (0,), (8, 4)),  # float32 only
    (np.float32, (1,), (8, 4)),  # not a leading axis (NumPy sums it pairwise)
    (np.float32, (0, 2), (8, 4, 3)),  # not a prefix
    (np.float32, (0, 1), (8, 4)),  # every axis: a scalar result
])
def test_other_sums_keep_numpy(dtype, axes, shape):
    assert leading_sums.leading_sum_kernel(ShapedArray(shape, np.dtype(dtype)), axes) is None


def test_split_over_threads_sums_each_block_in_c(monkeypatch):
    # leading_axis.split_sum hands each thread its rows; the C kernel
    # counts them from the operand it gets.
    monkeypatch.setattr(threads, "_cap", 3)
    monkeypatch.setattr(threads, "ELEMENTS_PER_THREAD", 4)
    monkeypatch.setattr(threads, "_streaming_scales", True)  # it splits there only
    calls = []
    real = native.elementwise
    sum_rows = real.sum_rows

    class Counting:
        def __getattr__(self, name):
            return getattr(real, name)

        @staticmethod
        def sum_rows(x, out, rows, cols):
            calls.append(rows)
            return sum_rows(x, out, rows, cols)

    monkeypatch.setattr(native, "elementwise", Counting())
    x = RNG.standard_normal((12, 5, 4)).astype(np.float32)
    got = _lowered_sum(x, (0, 1))(x)
    assert sum(calls) == 60 and len(calls) > 1
    blocks = threads.ranges(12, 1, 3)
    want = np.add.reduce(x[blocks[0][0]:blocks[0][1]], axis=(0, 1))
    for lo, hi in blocks[1:]:
        want = want + np.add.reduce(x[lo:hi], axis=(0, 1))
    assert got.tobytes() == want.tobytes()


def test_an_extension_built_before_sum_rows_falls_back_to_numpy(monkeypatch):
    # An editable install whose extension predates sum_rows (not rebuilt
    # after an update) must keep running: NumPy's reduction, same values.
    class Stale:
        pass

    monkeypatch.setattr(native, "elementwise", Stale())
    x = _awkward((16, 8, 4))
    assert leading_sums.leading_sum_kernel(_aval(x), (0, 1)) is None
    np.testing.assert_array_equal(_lowered_sum(x, (0, 1))(x), np.add.reduce(x, axis=(0, 1)))


@pytest.mark.skipif(not getattr(native.elementwise, "SUM_ROW_BLOCKS", 0)
                    or not leading_sums.product_pool.tasks_available(), reason="no C pool")
@pytest.mark.parametrize("cap, scales, blocks", [(2, False, 4), (2, True, 4), (16, True, 32),
                                                 (16, False, 32)])
def test_a_sum_too_narrow_for_column_blocks_splits_by_rows_on_the_c_pool(monkeypatch, cap,
                                                                         scales, blocks):
    # BatchNormalization's statistics in the benchmark CNN: 131072 rows of
    # 32 channels, too few columns for column blocks (SUM_TASK_COLUMNS):
    # two row blocks per thread in one C call, their partial sums added in
    # block order; on the C pool where bandwidth scales, elsewhere (this
    # project's 2-core VM) on the caller alone. The same blocks, so the same
    # bits, whatever the timing probe says: its answer varied between runs
    # of the transformer, and so did its loss (s23det).
    monkeypatch.setattr(threads, "_cap", cap)
    monkeypatch.setattr(threads, "_streaming_scales", scales)
    monkeypatch.setattr(threads, "backing_off", lambda: False)
    notes, calls = [], []
    monkeypatch.setattr(threads, "note_pool_split",
                        lambda done, count, threads: notes.append(count))
    real = native.elementwise

    class Recording:
        def __getattr__(self, name):
            return getattr(real, name)

        @staticmethod
        def sum_rows(x, out, rows, cols, *split):
            calls.append((rows, cols) + split)
            return real.sum_rows(x, out, rows, cols, *split)

    monkeypatch.setattr(native, "elementwise", Recording())
    x = _awkward((128, 32, 32, 32))
    kernel = _lowered_sum(x, (0, 1, 2))
    got = kernel(x)
    assert kernel.splits_itself  # never the Python pool's rows
    per = 131072 // blocks
    assert calls == [(131072, 32, cap if scales else 1, 0, per), (blocks, 32)]
    assert notes == ([blocks] if scales else [])
    with np.errstate(all="ignore"):
        partials = np.add.reduce(x.reshape(blocks, per, 32), axis=1)
        want = partials[0] + np.float32(0)
        for p in partials[1:]:
            want = want + p
    assert got.tobytes() == want.tobytes()


@pytest.mark.skipif(not leading_sums.product_pool.tasks_available(), reason="no C pool")
@pytest.mark.parametrize("scales", [False, True])
def test_a_sum_column_blocks_can_take_keeps_numpy_bits_where_bandwidth_does_not_scale(
        monkeypatch, scales):
    # 4096 x 256: column blocks where bandwidth scales; elsewhere the whole
    # sum on one thread, never row blocks (other bits: the probe's answer
    # would then change them).
    monkeypatch.setattr(threads, "_cap", 2)
    monkeypatch.setattr(threads, "_streaming_scales", scales)
    monkeypatch.setattr(threads, "backing_off", lambda: False)
    x = _awkward((64, 64, 256))
    kernel = _lowered_sum(x, (0, 1))
    assert kernel.splits_itself
    with np.errstate(all="ignore"):
        got, want = kernel(x), np.add.reduce(x, axis=(0, 1))
    assert got.tobytes() == want.tobytes()


@pytest.mark.skipif(not getattr(native.elementwise, "SUM_ROW_BLOCKS", 0), reason="old build")
def test_row_block_sums_of_one_row_and_refused_buffers():
    x = _awkward((7, 5))
    partials = np.full((3, 5), 9.0, np.float32)
    assert native.elementwise.sum_rows(x, partials, 7, 5, 1, 0, 3) is True
    with np.errstate(all="ignore"):
        want = [np.add.reduce(x[lo:lo + 3], axis=0) for lo in (0, 3, 6)]
    assert partials.tobytes() == np.stack(want).tobytes()
    # out must hold one partial per block; nothing written otherwise.
    short = np.full((2, 5), 9.0, np.float32)
    assert native.elementwise.sum_rows(x, short, 7, 5, 1, 0, 3) is False
    assert (short == 9.0).all()
    with pytest.raises(ValueError):
        native.elementwise.sum_rows(x, partials, 7, 5, 1, 0, -1)
