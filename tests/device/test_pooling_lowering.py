"""Max pooling and its gradient as compiled programs lower them
(compiler/pooling_lowering.py): the C kernels with their geometry bound,
split on the C pool in tasks whose count grows with the threads (a
16-thread host simulated by the cap: counts, not speed), never split again
over the Python pool, with the NumPy kernels' bits."""

import numpy as np
import pytest

from keras_ipu.device import native
from keras_ipu.device.compiler import pooling_lowering  # noqa: F401 (registers)
from keras_ipu.device.compiler.lowering import lower
from keras_ipu.device.ir import ShapedArray
from keras_ipu.device.native import product_pool
from keras_ipu.device.native import threads as host_threads
from keras_ipu.device.primitives import pooling
from keras_ipu.device.primitives.pooling import reduce_window_p
from keras_ipu.device.primitives.pooling import select_and_scatter_add_p

RNG = np.random.default_rng(16)
_POOL = {"op": "max", "window_dimensions": (1, 2, 2, 1), "window_strides": (1, 2, 2, 1),
         "padding": ((0, 0),) * 4, "base_dilation": (1,) * 4, "window_dilation": (1,) * 4}
_SELECT = {k: _POOL[k] for k in ("op", "window_dimensions", "window_strides", "padding",
                                 "window_dilation")}

needs_c_pool = pytest.mark.skipif(
    native.pooling is None or not product_pool.tasks_available(),
    reason="native/_pooling.c or the C pool is not built")


class Recording:
    """native.pooling whose kernels record their split arguments
    (threads, rows per task; () where a call runs on one thread)."""

    def __init__(self, real):
        self.real, self.calls = real, []

    def reduce_max(self, *args):
        self.calls.append(("reduce_max", args[7:]))
        return self.real.reduce_max(*args)

    def select_tiled(self, *args):
        self.calls.append(("select_tiled", args[8:]))
        return self.real.select_tiled(*args)


@pytest.fixture
def host(monkeypatch):
    """Sets the thread cap and whether memory bandwidth scales; records
    the C kernels' calls and the splits noted for the back-off."""
    recording = Recording(native.pooling)
    monkeypatch.setattr(native, "pooling", recording)
    monkeypatch.setattr(host_threads, "backing_off", lambda: False)
    notes = []
    monkeypatch.setattr(host_threads, "note_pool_split",
                        lambda done, count, threads: notes.append((count, threads)))

    def configure(cap, scales):
        monkeypatch.setattr(host_threads, "_cap", cap)
        monkeypatch.setattr(host_threads, "_streaming_scales", scales)
        return recording.calls, notes

    return configure


def _lowered(primitive, params, *operands):
    avals = tuple(ShapedArray(x.shape, x.dtype) for x in operands)
    return lower(primitive, params, avals, (primitive.abstract_eval(*avals, **params),))


def _numpy_pool(x, params=_POOL):
    saved, native.pooling = native.pooling, None
    try:
        return pooling._reduce_window(x, **params)
    finally:
        native.pooling = saved


@needs_c_pool
@pytest.mark.parametrize("cap, scales", [(2, False), (2, True), (16, True), (16, False)])
def test_the_cnns_max_pool_splits_on_the_c_pool_in_tasks_per_thread(host, cap, scales):
    # The benchmark CNN's first pool: 128 images of 32x32x32, windows of
    # 2x2, 32768 rows of 32 channels in the result.
    calls, notes = host(cap, scales)
    x = RNG.standard_normal((128, 32, 32, 32), dtype=np.float32)
    x.reshape(-1)[RNG.choice(x.size, 8, replace=False)] = np.nan
    kernel = _lowered(reduce_window_p, _POOL, x)
    assert kernel.splits_itself  # leading_axis leaves it: no Python pool blocks
    got = kernel(x)
    # One C call for the whole operand, two tasks of whole rows per thread
    # (compute-bound: it splits whether or not bandwidth scales).
    assert calls == [("reduce_max", (cap, 32768 // (2 * cap)))]
    assert notes == [(2 * cap, cap)]
    assert got.tobytes() == _numpy_pool(x).tobytes()


@needs_c_pool
@pytest.mark.parametrize("cap, scales, split", [(1, True, ()), (2, False, ()),
                                                (16, True, (16, 1024))])
def test_the_pool_gradient_splits_where_bandwidth_scales(host, cap, scales, split):
    calls, notes = host(cap, scales)
    x = RNG.integers(0, 3, (128, 32, 32, 32)).astype(np.float32)  # ties in most windows
    y = _numpy_pool(x)
    g = RNG.standard_normal(y.shape, dtype=np.float32)
    kernel = _lowered(select_and_scatter_add_p, _SELECT, g, x, y)
    got = kernel(g, x, y)
    assert calls == [("select_tiled", split)]
    assert notes == ([(32, 16)] if split else [])
    with np.errstate(all="ignore"):
        saved, native.pooling = native.pooling, None
        try:
            want = pooling._select_and_scatter_add(g, x, y, **_SELECT)
        finally:
            native.pooling = saved
    assert got.tobytes() == want.tobytes()


@needs_c_pool
def test_pools_the_c_kernel_does_not_take_keep_the_primitives_kernel(host):
    calls, _ = host(2, False)
    x = RNG.standard_normal((8, 6, 6, 3), dtype=np.float32)
    padded = dict(_POOL, padding=((0, 0), (1, 1), (1, 1), (0, 0)))
    average = dict(_POOL, op="sum")
    for params in (padded, average):
        kernel = _lowered(reduce_window_p, params, x)
        assert not getattr(kernel, "splits_itself", False)
        np.testing.assert_array_equal(kernel(x), _numpy_pool(x, params))
    assert calls == []
    # No images (Keras' layer tests build batches of 0): nothing for C.
    empty = np.zeros((0, 4, 4, 3), np.float32)
    kernel = _lowered(reduce_window_p, _POOL, empty)
    assert kernel(empty).shape == (0, 2, 2, 3) and calls == []
    gy = np.zeros((0, 2, 2, 3), np.float32)
    kernel = _lowered(select_and_scatter_add_p, _SELECT, gy, empty, gy)
    assert kernel(gy, empty, gy).shape == (0, 4, 4, 3) and calls == []


@needs_c_pool
def test_a_refused_buffer_falls_back_to_the_numpy_kernel(host, monkeypatch):
    calls, _ = host(2, False)
    x = RNG.standard_normal((4, 8, 8, 3), dtype=np.float32)
    kernel = _lowered(reduce_window_p, _POOL, x)
    monkeypatch.setattr(native.pooling.real, "reduce_max", lambda *args: False)
    np.testing.assert_array_equal(kernel(x), _numpy_pool(x))
    assert calls  # tried the C kernel first
