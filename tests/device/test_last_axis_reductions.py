"""Float sums and maxima along the last axis in C
(device/native/last_axis_reductions.py, native/_rows.c): NumPy's bits,
NumPy's fallback where the C kernel does not apply or leaves rows to it."""

import numpy as np
import pytest

from keras_ipu.device import native
from keras_ipu.device.compiler.lowering import lower
from keras_ipu.device.ir import ShapedArray
from keras_ipu.device.native import last_axis_reductions
from keras_ipu.device.native import threads
from keras_ipu.device.primitives.reduce import reduce_max_p
from keras_ipu.device.primitives.reduce import reduce_sum_p

pytestmark = pytest.mark.skipif(native.rows is None, reason="C kernel not built")

RNG = np.random.default_rng(11)
# Up to one pairwise block (8 accumulators), several blocks (halves), tails.
LENGTHS = (1, 2, 7, 8, 9, 17, 64, 127, 128, 129, 200, 257, 1000, 4097)


def _aval(x):
    return ShapedArray(np.shape(x), np.asarray(x).dtype)


def _lowered(primitive, x, axes):
    out = primitive.abstract_eval(_aval(x), axes=axes)
    return lower(primitive, {"axes": axes}, (_aval(x),), (out,))


def _scaled(shape, dtype):
    """Rows whose sums depend on the order of the adds: magnitudes from
    1e-3 to 1e5 within a row."""
    x = RNG.standard_normal(shape) * 10.0 ** RNG.integers(-3, 6, shape)
    return x.astype(dtype)


def _awkward(shape, dtype):
    """With -0.0, infinities of both signs (inf - inf: a NaN of the other
    sign than np.nan's), NaN and values that overflow when added."""
    x = _scaled(shape, dtype)
    flat = x.reshape(-1)
    flat[::97] = np.finfo(dtype).max / 2
    flat[5::101] = -0.0
    flat[7::211] = np.inf
    flat[11::307] = -np.inf
    flat[13::401] = np.nan
    x[..., 1, :] = -0.0  # a row of negative zeros sums to +0.0
    return x


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", LENGTHS)
def test_the_c_sum_adds_in_numpys_pairwise_order(dtype, n):
    # The C kernel alone: a sequential or differently blocked sum rounds
    # differently on these rows.
    x = _scaled((23, n), dtype)
    out = np.empty(23, dtype)
    assert native.rows.sum_last(x, out, n) is True
    assert out.tobytes() == np.add.reduce(x, axis=-1).tobytes()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_no_rows_reduce_to_nothing(monkeypatch, dtype):
    # An operand with no rows (a batch of 0: Keras' layer tests build one):
    # the whole call's one task of "all rows" was 0 rows, and counting the
    # tasks divided by it (SIGFPE in the fifteenth pass's CI).
    x = np.empty((0, 5), dtype)
    assert native.rows.sum_last(x, np.empty(0, dtype), 5) is True
    assert native.rows.max_last(x, np.empty(0, dtype), 5) == 0
    # and in row tasks: no task at all
    assert native.rows.sum_last(x, np.empty(0, dtype), 5, 2, 1) == (0, 0.0, 0.0)
    assert native.rows.max_last(x, np.empty(0, dtype), 5, 2, 1) == (0, 0, 0.0, 0.0)
    monkeypatch.setattr(threads, "_cap", 1)
    x = np.empty((0, 4, 5), dtype)
    for primitive, ufunc in ((reduce_sum_p, np.add), (reduce_max_p, np.maximum)):
        got = _lowered(primitive, x, (2,))(x)
        assert got.shape == (0, 4) and got.dtype == dtype


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", LENGTHS)
def test_lowered_sums_and_maxima_give_numpys_bits(monkeypatch, dtype, n):
    monkeypatch.setattr(threads, "_cap", 1)
    x = _awkward((3, 4, n), dtype)
    for primitive, ufunc, name in ((reduce_sum_p, np.add, "sum_last_axis"),
                                   (reduce_max_p, np.maximum, "max_last_axis")):
        kernel = _lowered(primitive, x, (2,))
        assert kernel.__name__ == name
        with np.errstate(all="ignore"):  # the overflows are the point
            got = kernel(x)
            want = ufunc.reduce(x, axis=-1)
        assert got.dtype == want.dtype and got.shape == want.shape
        # bit for bit: NaN payloads and the sign of zeros included
        assert got.tobytes() == want.tobytes()


def test_the_c_maximum_leaves_nan_and_zero_rows_to_numpy():
    x = _scaled((8, 40), np.float32)
    x[1] = -0.0
    x[2, ::2], x[2, 1::2] = 0.0, -0.0  # a maximum of zero: its sign is NumPy's
    x[3] = -np.abs(x[3])
    x[3, 7] = 0.0
    x[4, 9] = np.nan
    x[5, 3] = np.inf  # decided: +inf is the maximum
    x[6] = -np.inf
    out = np.empty(8, np.float32)
    assert native.rows.max_last(x, out, 40) == 4
    want = np.maximum.reduce(x, axis=-1)
    decided = [0, 5, 6, 7]
    assert out[decided].tobytes() == want[decided].tobytes()
    with np.errstate(invalid="ignore"):
        got = _lowered(reduce_max_p, x, (1,))(x)
    assert got.tobytes() == want.tobytes()


def test_non_contiguous_operands_fall_back_to_numpy(monkeypatch):
    monkeypatch.setattr(threads, "_cap", 1)
    x = _awkward((6, 4, 64), np.float32)[:, :, ::2]  # the C kernels decline it
    assert native.rows.sum_last(x, np.empty((6, 4), np.float32), 32) is False
    assert native.rows.max_last(x, np.empty((6, 4), np.float32), 32) == -1
    for primitive, ufunc in ((reduce_sum_p, np.add), (reduce_max_p, np.maximum)):
        with np.errstate(all="ignore"):
            want = ufunc.reduce(x, axis=-1)
            got = _lowered(primitive, x, (-1,))(x)
        assert got.tobytes() == want.tobytes()


@pytest.mark.parametrize("dtype, axes, shape", [
    (np.float16, (1,), (8, 4)),  # float32 and float64 only
    (np.int32, (1,), (8, 4)),
    (np.float32, (0,), (8, 4)),  # not the last axis
    (np.float32, (1, 2), (8, 4, 3)),  # more than one axis
    (np.float32, (0,), (8,)),  # every axis: a scalar result
    (np.float32, (1,), (8, 0)),  # empty rows
])
def test_other_reductions_keep_numpy(dtype, axes, shape):
    aval = ShapedArray(shape, np.dtype(dtype))
    assert last_axis_reductions.last_axis_sum_kernel(aval, axes) is None
    assert last_axis_reductions.last_axis_max_kernel(aval, axes) is None


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", (1, 9, 64, 129, 1000))
def test_row_tasks_on_the_c_pool_give_the_whole_calls_bits(dtype, n):
    x = _awkward((37, 3, n), dtype)
    rows = 37 * 3
    whole_sum, whole_max = np.empty(rows, dtype), np.empty(rows, dtype)
    with np.errstate(all="ignore"):
        assert native.rows.sum_last(x, whole_sum, n) is True
        undecided = native.rows.max_last(x, whole_max, n)
        for t, per_task in ((2, 1), (2, 56), (3, 7), (4, 1000)):
            got = np.full(rows, np.nan, dtype)
            ran, own, wait = native.rows.sum_last(x, got, n, t, per_task)
            assert 0 <= ran <= -(-rows // per_task) and own >= 0 and wait >= 0
            assert got.tobytes() == whole_sum.tobytes()
            got = np.full(rows, np.nan, dtype)
            left, *stats = native.rows.max_last(x, got, n, t, per_task)
            assert left == undecided and len(stats) == 3
            assert got.tobytes() == whole_max.tobytes()
    with pytest.raises(ValueError):
        native.rows.sum_last(x, whole_sum, n, 2, 0)
    with pytest.raises(ValueError):
        native.rows.max_last(x, whole_max, n, 0, 4)
    with pytest.raises(TypeError):  # threads without rows_per_task
        native.rows.sum_last(x, whole_sum, n, 2)


@pytest.mark.skipif(not getattr(native.rows, "SPLITS", 0)
                    or not last_axis_reductions.product_pool.tasks_available(),
                    reason="no C pool")
@pytest.mark.parametrize("n", [64, 200])  # 200: a sum in halves, NaN rows summed again
@pytest.mark.parametrize("scales", [False, True])
def test_rows_split_on_the_c_pool_where_bandwidth_scales(monkeypatch, scales, n):
    monkeypatch.setattr(threads, "_cap", 2)
    monkeypatch.setattr(threads, "NATIVE_ELEMENTS_PER_THREAD", 4)
    monkeypatch.setattr(threads, "_streaming_scales", scales)
    monkeypatch.setattr(threads, "backing_off", lambda: False)
    notes = []
    monkeypatch.setattr(threads, "note_pool_split",
                        lambda done, count, threads_=None: notes.append(count))
    x = _awkward((12, 5, n), np.float32)
    x[3, 2, 5] = np.nan  # a row the maximum leaves to NumPy, split or not
    for primitive, ufunc in ((reduce_sum_p, np.add), (reduce_max_p, np.maximum)):
        del notes[:]
        kernel = _lowered(primitive, x, (2,))
        with np.errstate(all="ignore"):
            got, want = kernel(x), ufunc.reduce(x, axis=-1)
        assert got.tobytes() == want.tobytes()
        # 60 rows in two tasks per thread
        assert notes == ([4] if scales else []), (primitive, notes)
        assert kernel.splits_itself  # never the Python pool's rows
        # An operand the C kernel declines (not C-contiguous): NumPy's, no split noted.
        del notes[:]
        strided = np.concatenate([x, x], axis=-1)[..., ::2]
        with np.errstate(all="ignore"):
            got, want = kernel(strided), ufunc.reduce(strided, axis=-1)
        assert got.tobytes() == want.tobytes() and notes == []


def test_a_stale_extension_without_row_tasks_runs_whole(monkeypatch):
    # An editable install whose _rows predates the split arguments.
    monkeypatch.setattr(threads, "_cap", 2)
    monkeypatch.setattr(threads, "ELEMENTS_PER_THREAD", 4)
    calls = []
    real = native.rows

    monkeypatch.setattr(threads, "NATIVE_ELEMENTS_PER_THREAD", 4)
    monkeypatch.setattr(threads, "_streaming_scales", True)

    class Counting:  # no SPLITS
        @staticmethod
        def sum_last(x, out, n):
            calls.append(x.size // n)
            return real.sum_last(x, out, n)

        max_last = staticmethod(real.max_last)

    monkeypatch.setattr(native, "rows", Counting())
    x = _scaled((12, 5, 64), np.float32)
    got = _lowered(reduce_sum_p, x, (2,))(x)
    assert calls == [60]
    assert got.tobytes() == np.add.reduce(x, axis=-1).tobytes()


def test_without_the_extension_numpy_reduces(monkeypatch):
    # KERAS_IPU_NATIVE=0 (or no compiler): native.rows is None.
    monkeypatch.setattr(native, "rows", None)
    x = _awkward((4, 5, 64), np.float32)
    assert last_axis_reductions.last_axis_sum_kernel(_aval(x), (2,)) is None
    with np.errstate(all="ignore"):
        assert _lowered(reduce_sum_p, x, (2,))(x).tobytes() == np.add.reduce(
            x, axis=-1).tobytes()
