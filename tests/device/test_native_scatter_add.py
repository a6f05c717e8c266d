"""The row scatter-add C kernel (native/_scatter_add.c) against np.add.at."""

import numpy as np
import pytest

from keras_ipu.device import native
from keras_ipu.device.compiler.lowering import lower
from keras_ipu.device.ir import ShapedArray
from keras_ipu.device.primitives import REGISTRY

pytestmark = pytest.mark.skipif(
    native.scatter_add is None, reason="the C extension is not built here"
)
rng = np.random.default_rng(16)


def _add_at(x, idx, upd):
    """The reference: np.add.at after the eager kernel's index rules
    (negative indices wrap once, out-of-range ones are dropped)."""
    n = x.shape[0]
    rows = idx.reshape(-1).astype(np.int64)
    rows = np.where(rows < 0, rows + n, rows)
    keep = (rows >= 0) & (rows < n)
    out = x.copy()
    np.add.at(out, rows[keep], upd.reshape((-1,) + x.shape[1:])[keep])
    return out


def _order_sensitive(count, row_shape, dtype):
    """Updates whose sum depends on the order they are added in: large
    values that cancel mixed with small ones."""
    upd = rng.standard_normal((count,) + row_shape)
    big = rng.random(count) < 0.3
    upd[big] *= 1e3 if np.dtype(dtype) == np.float16 else 1e8
    return upd.astype(dtype)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("index_dtype", ["int32", "int64"])
@pytest.mark.parametrize("rows, row_shape, count", [
    (1000, (64,), 8192),   # the benchmark transformer's embedding gradient
    (7, (3,), 200),        # every row many times
    (50, (), 40),          # scalar rows
    (4, (2, 3), 0),        # no updates
])
def test_kernel_is_add_at_bit_for_bit(dtype, index_dtype, rows, row_shape, count):
    x = rng.standard_normal((rows,) + row_shape).astype(dtype)
    # Repeated, negative and out-of-range (both ends) indices.
    idx = rng.integers(-rows - 3, rows + 3, count).astype(index_dtype)
    upd = _order_sensitive(count, row_shape, dtype)
    out = x.copy()
    row_len = int(np.prod(row_shape, dtype=np.int64))
    assert native.scatter_add.rows(out, idx, upd, rows, row_len) is True
    assert out.tobytes() == _add_at(x, idx, upd).tobytes()


def test_order_matters_for_these_updates():
    # The test above could not tell add.at's order from another one if the
    # data did not depend on it: here the reversed order differs.
    x = np.zeros((3, 4), np.float32)
    idx = rng.integers(0, 3, 300)
    upd = _order_sensitive(300, (4,), np.float32)
    forward = _add_at(x, idx, upd)
    backward = _add_at(x, idx[::-1].copy(), upd[::-1].copy())
    assert forward.tobytes() != backward.tobytes()


@pytest.mark.parametrize("case", ["float16", "strided", "int16 index", "short update",
                                  "read-only", "float64 update", "byte-swapped",
                                  "float index"])
def test_buffers_it_does_not_take_leave_out_untouched(case):
    x = np.zeros((6, 4), np.float32)
    idx = np.array([0, 2, 2], np.int64)
    upd = np.ones((3, 4), np.float32)
    if case == "float16":
        x, upd = x.astype(np.float16), upd.astype(np.float16)
    elif case == "strided":
        upd = np.ones((3, 8), np.float32)[:, ::2]
    elif case == "int16 index":
        idx = idx.astype(np.int16)
    elif case == "short update":
        upd = upd[:2]
    elif case == "read-only":
        x.flags.writeable = False
    elif case == "float64 update":
        upd = upd.astype(np.float64)
    elif case == "byte-swapped":  # a format with a non-native byte order
        x = x.astype(x.dtype.newbyteorder())
    elif case == "float index":
        idx = idx.astype(np.float64)
    before = x.copy()
    assert native.scatter_add.rows(x, idx, upd, 6, 4) is False
    assert x.tobytes() == before.tobytes()


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_lowered_scatter_equals_the_numpy_path(monkeypatch, dtype):
    prim = REGISTRY["scatter"]
    params = dict(mode="add", batch_dims=0)
    x = rng.standard_normal((40, 5)).astype(dtype)
    idx = rng.integers(-42, 42, (30, 7, 1)).astype(np.int32)
    upd = _order_sensitive(210, (5,), dtype).reshape(30, 7, 5)
    avals = [ShapedArray(a.shape, a.dtype) for a in (x, idx, upd)]
    out_aval = prim.abstract_eval(*avals, **params)
    with_c = lower(prim, params, avals, (out_aval,))(x, idx, upd)
    monkeypatch.setattr(native, "scatter_add", None)
    without_c = lower(prim, params, avals, (out_aval,))(x, idx, upd)
    eager = np.asarray(prim.kernel(x, idx, upd, **params))
    assert with_c.dtype == without_c.dtype == eager.dtype == np.dtype(dtype)
    assert with_c.tobytes() == without_c.tobytes() == eager.tobytes()


def test_an_embedding_gradient_takes_the_c_loop(monkeypatch):
    # The lowered kernel must not fall back silently on the layout Keras'
    # Embedding gradient has: int32 indices (batch, seq, 1), float32 rows.
    taken = []
    real = native.scatter_add

    class Recording:
        @staticmethod
        def rows(*args):
            taken.append(real.rows(*args))
            return taken[-1]

    monkeypatch.setattr(native, "scatter_add", Recording)
    prim = REGISTRY["scatter"]
    params = dict(mode="add", batch_dims=0)
    x = np.zeros((100, 16), np.float32)
    idx = rng.integers(0, 100, (8, 12, 1)).astype(np.int32)
    upd = rng.standard_normal((8, 12, 16)).astype(np.float32)
    avals = [ShapedArray(a.shape, a.dtype) for a in (x, idx, upd)]
    out = lower(prim, params, avals, (prim.abstract_eval(*avals, **params),))(x, idx, upd)
    assert taken == [True]
    assert out.tobytes() == _add_at(x, idx, upd).tobytes()
