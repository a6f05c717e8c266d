"""The four kernels that run a C kernel's tasks on the C pool
(threads.split_kernel): a pool and its gradient (primitives/pooling.py),
a sum and a maximum over the last axis (native/last_axis_reductions.py),
a sum over the leading axes in column and in row blocks
(native/leading_sums.py) and a fused C chain (compiler/native_fusion.py).
At a cap of 2 and of 16 threads each splits in the tasks its own rule
plans and notes that count with its threads; where the C kernel declines
the operand each falls back as it did, noting nothing for that call."""

import numpy as np
import pytest
from compiler_graphs import aval
from compiler_graphs import build
from compiler_graphs import lit

from keras_ipu.device import native
from keras_ipu.device.compiler import pooling_lowering  # noqa: F401 (registers)
from keras_ipu.device.compiler.executable import Executable
from keras_ipu.device.compiler.fusion import fuse_elementwise
from keras_ipu.device.compiler.lowering import lower
from keras_ipu.device.ir import ShapedArray
from keras_ipu.device.native import product_pool
from keras_ipu.device.native import threads
from keras_ipu.device.primitives import pooling
from keras_ipu.device.primitives.pooling import reduce_window_p
from keras_ipu.device.primitives.reduce import reduce_max_p
from keras_ipu.device.primitives.reduce import reduce_sum_p

pytestmark = [
    pytest.mark.skipif(
        None in (native.pooling, native.rows, native.elementwise)
        or not product_pool.tasks_available()
        or not getattr(native.rows, "SPLITS", 0)
        or not getattr(native.elementwise, "SUM_ROW_BLOCKS", 0),
        reason="the C kernels or the C pool are not built"),
    pytest.mark.parametrize("cap", [2, 16]),
]

RNG = np.random.default_rng(17)
_POOL = {"op": "max", "window_dimensions": (1, 2, 2, 1), "window_strides": (1, 2, 2, 1),
         "padding": ((0, 0),) * 4, "base_dilation": (1,) * 4, "window_dilation": (1,) * 4}


_BUSY = []  # backing_off() while it holds anything


@pytest.fixture
def notes(monkeypatch, cap):
    """The (count, threads) of each split noted, at `cap` threads where
    bandwidth scales, with small kernels worth splitting; backing off
    while _BUSY holds anything (kernels bind backing_off when lowered)."""
    monkeypatch.setattr(threads, "_cap", cap)
    monkeypatch.setattr(threads, "_streaming_scales", True)
    monkeypatch.setattr(threads, "NATIVE_ELEMENTS_PER_THREAD", 64)
    monkeypatch.setattr(threads, "backing_off", lambda: bool(_BUSY))
    del _BUSY[:]
    noted = []

    def note(done, count, threads_=None):
        ran, own, wait = done  # the stats alone, as note_pool_split reads them
        assert 0 <= ran <= count and own >= 0 and wait >= 0
        noted.append((count, threads_))

    monkeypatch.setattr(threads, "note_pool_split", note)
    yield noted
    del _BUSY[:]


def _backing_off(notes, run, want):
    """While backing off: the whole call's bits (`want`), no split noted."""
    del notes[:]
    _BUSY.append(True)
    try:
        assert run().tobytes() == want.tobytes()
    finally:
        del _BUSY[:]
    assert notes == []


def _lowered(primitive, params, *operands):
    avals = tuple(ShapedArray(x.shape, x.dtype) for x in operands)
    return lower(primitive, params, avals, (primitive.abstract_eval(*avals, **params),))


def _tasks(rows, threads_):
    """Tasks of whole rows, BLOCKS_PER_THREAD per thread."""
    per_task = -(-rows // (threads_ * threads.BLOCKS_PER_THREAD))
    return -(-rows // per_task)


def test_a_max_pool(notes, cap, monkeypatch):
    real, declines = native.pooling, []

    class Switched:  # the real kernel, or one declining the buffers
        @staticmethod
        def reduce_max(*args):
            return False if declines else real.reduce_max(*args)

    monkeypatch.setattr(native, "pooling", Switched)
    x = RNG.standard_normal((8, 16, 16, 8), dtype=np.float32)  # 512 rows of 8 channels
    kernel = _lowered(reduce_window_p, _POOL, x)
    saved, native.pooling = native.pooling, None
    try:
        want = pooling._reduce_window(x, **_POOL)
    finally:
        native.pooling = saved
    assert kernel(x).tobytes() == want.tobytes()
    assert notes == [(_tasks(512, cap), cap)]
    _backing_off(notes, lambda: kernel(x), want)
    # Buffers the C kernel declines: the primitive's NumPy kernel, no note.
    del notes[:]
    declines.append(True)
    assert kernel(x).tobytes() == want.tobytes()
    assert notes == []


@pytest.mark.parametrize("primitive, ufunc", [(reduce_sum_p, np.add),
                                              (reduce_max_p, np.maximum)])
def test_a_last_axis_reduction(notes, cap, primitive, ufunc):
    x = RNG.standard_normal((12, 40, 200), dtype=np.float32)  # 480 rows, in halves
    x[3, 2, 5] = np.nan  # a row NumPy reduces again, split or not
    avals = (ShapedArray(x.shape, x.dtype),)
    kernel = lower(primitive, {"axes": (2,)}, avals,
                   (primitive.abstract_eval(*avals, axes=(2,)),))
    with np.errstate(all="ignore"):
        assert kernel(x).tobytes() == ufunc.reduce(x, axis=-1).tobytes()
        assert notes == [(_tasks(480, cap), cap)]
        _backing_off(notes, lambda: kernel(x), ufunc.reduce(x, axis=-1))
        strided = np.concatenate([x, x], axis=-1)[..., ::2]  # declined: NumPy's
        assert kernel(strided).tobytes() == ufunc.reduce(strided, axis=-1).tobytes()
    assert notes == []


def _leading_sum(x, axes):
    avals = (ShapedArray(x.shape, x.dtype),)
    return lower(reduce_sum_p, {"axes": axes}, avals,
                 (reduce_sum_p.abstract_eval(*avals, axes=axes),))


def test_a_leading_sum_in_column_blocks(notes, cap):
    x = RNG.standard_normal((16, 4, 2048), dtype=np.float32)  # 64 rows of 2048 columns
    kernel = _leading_sum(x, (0, 1))
    want = np.add.reduce(x, axis=(0, 1))
    assert kernel(x).tobytes() == want.tobytes()
    threads_, width = threads.sum_split(64, 2048)
    assert threads_ == cap
    assert notes == [(-(-2048 // width), cap)]
    _backing_off(notes, lambda: kernel(x), want)
    strided = np.asfortranarray(x)  # declined: NumPy's, no note
    assert kernel(strided).tobytes() == np.add.reduce(strided, axis=(0, 1)).tobytes()
    assert notes == []


def test_a_leading_sum_in_row_blocks(notes, cap):
    x = RNG.standard_normal((64, 64, 32), dtype=np.float32)  # 4096 rows of 32 columns
    kernel = _leading_sum(x, (0, 1))
    blocks = _tasks(4096, cap)
    partials = np.add.reduce(x.reshape(blocks, -1, 32), axis=1)
    want = partials[0] + np.float32(0)
    for p in partials[1:]:
        want = want + p
    assert kernel(x).tobytes() == want.tobytes()
    assert notes == [(blocks, cap)]
    _backing_off(notes, lambda: kernel(x), want)  # the same blocks on one thread
    strided = np.asfortranarray(x)  # declined: NumPy's, no note
    assert kernel(strided).tobytes() == np.add.reduce(strided, axis=(0, 1)).tobytes()
    assert notes == []


def test_a_fused_chain(notes, cap, monkeypatch):
    planned = []
    ranges = threads.ranges
    monkeypatch.setattr(threads, "ranges", lambda *a: planned.append(ranges(*a)) or planned[-1])

    def body(b, x, s):
        return [b.op("add", b.op("mul", x, s), lit(1.0, "float32"))]

    shape = (40, 31, 24)
    x, s = (RNG.standard_normal(shape, dtype=np.float32) for _ in range(2))
    exe = Executable(fuse_elementwise(build([aval(shape), aval(shape)], body)))
    want = x * s + np.float32(1.0)
    (got,) = exe.run(x, s)
    assert got.tobytes() == want.tobytes()
    count = len(planned[-1])
    assert count > 1 and notes == [(count, cap)]
    _backing_off(notes, lambda: exe.run(x, s)[0], want)
    # A strided operand: the C call declines it (no note), then runs split on
    # a contiguous copy.
    del notes[:]
    (got,) = exe.run(np.asfortranarray(x), s)
    assert got.tobytes() == want.tobytes() and notes == [(count, cap)]
