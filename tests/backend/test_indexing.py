"""x[key] against NumPy for many keys, eager and traced (None dims), and the
keras.ops core slice/scatter/unstack functions."""

import os

os.environ.setdefault("KERAS_BACKEND", "ipu")

import keras  # noqa: E402,F401  (loads the backend through the hook)
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from keras_ipu.backend import core  # noqa: E402
from keras_ipu.backend import indexing  # noqa: E402
from keras_ipu.device.ir import ShapedArray  # noqa: E402
from keras_ipu.device.trace import GraphBuilder  # noqa: E402

X = np.arange(2 * 3 * 4 * 5).reshape(2, 3, 4, 5)
T = core.convert_to_tensor(X)
i32 = core.convert_to_tensor(np.int32(1))
neg = core.convert_to_tensor(np.int32(-1))
vec = core.convert_to_tensor(np.array([1, 0]))

KEYS = [
    1,
    -1,
    (1, 2),
    (1, -1, -2),
    slice(None, None, -1),
    (slice(None), slice(3, 0, -2)),
    (Ellipsis, -1),
    (None, 1, Ellipsis, None),
    (slice(-10, 10, 3),),
    (slice(5, -7, -1),),
    (slice(-1, -3, -1), slice(None), slice(None), slice(-2, None)),
    (slice(None), slice(None, None, -2), slice(2, -1)),
    (slice(None, None, -1), None, 2, slice(1, None, -1)),
    (..., -1, 2),
    (..., -1, slice(-1, -2)),
    (1, None, 2),
    ([0, 1],),
    ([0, 1], [2, 0]),
    (slice(None), [0, 2], [1, 3]),
    (0, slice(None), [1, 2]),
    (slice(None), 0, [1, 2]),
    (np.array([[0], [1]]), slice(None), np.array([0, 2, 3])),
    (1, None, [0, 1], None),
    (Ellipsis, [4, -5]),
    ([[1]], Ellipsis, [[1, 2]]),
    (X[..., 0, 0] > 5,),
    (slice(None), X[0, :, :, 0] % 2 == 0),
    (np.array([True, False]),),
    (1, np.array([True, False, True]), slice(None, None, -1)),
    (Ellipsis,),
]


def _np_key(key):
    def conv(e):
        return np.asarray(e) if isinstance(e, core.Tensor) else e

    return tuple(conv(e) for e in key) if isinstance(key, tuple) else conv(key)


@pytest.mark.parametrize("key", KEYS, ids=[str(i) for i in range(len(KEYS))])
def test_getitem_matches_numpy(key):
    want = X[_np_key(key)]
    got = np.asarray(indexing.getitem(T, key))
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize(
    "key",
    [(i32,), (slice(None), neg, 2), (vec,), (neg, vec), (i32, slice(None), vec)],
)
def test_getitem_with_tensor_indices(key):
    want = X[_np_key(key)]
    got = np.asarray(T[key])
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)


def test_getitem_errors_name_the_problem():
    with pytest.raises(IndexError, match="out of bounds"):
        indexing.getitem(T, 7)
    with pytest.raises(IndexError, match="too many indices"):
        indexing.getitem(T, (0, 0, 0, 0, 0))
    with pytest.raises(IndexError, match="integers"):
        indexing.getitem(T, np.array([0.5]))


def _traced(shape, dtype=np.float32):
    return GraphBuilder().new_input(ShapedArray(shape, dtype))


@pytest.mark.parametrize(
    "key,shape",
    [
        ((slice(None), 0), (None,)),
        ((Ellipsis, slice(None, None, -1)), (None, 5)),
        ((slice(1, None), None, slice(0, 3)), (None, 1, 3)),
        ((slice(None), [0, 2, 4]), (None, 3)),
        ((-1,), (5,)),
        ((slice(None, None, 2), -2), (None,)),
    ],
)
def test_getitem_traced_none_dims(key, shape):
    x = _traced((None, 5))
    assert indexing.getitem(x, key).shape == shape


def test_getitem_traced_scalar_index_and_mask_error():
    b = GraphBuilder()
    x = b.new_input(ShapedArray((None, 5), np.float32))
    i = b.new_input(ShapedArray((), np.int32))
    assert indexing.getitem(x, (slice(None), i)).shape == (None,)
    m = b.new_input(ShapedArray((None,), np.bool_))
    with pytest.raises(IndexError, match="boolean mask"):
        indexing.getitem(x, m)


def test_scatter_and_scatter_update():
    got = indexing.scatter(np.array([[0, 1], [2, 0], [0, 1]]), np.array([1, 2, 3]), (3, 2))
    np.testing.assert_array_equal(got, [[0, 4], [0, 0], [2, 0]])
    base = np.arange(8.0).reshape(4, 2)
    got = indexing.scatter_update(base, [[1], [3]], np.ones((2, 2)))
    want = base.copy()
    want[[1, 3]] = 1
    np.testing.assert_array_equal(got, want)
    got = indexing.scatter_update(base, [[0, 0], [0, 0]], np.array([5.0, 7.0]), "max")
    assert np.asarray(got)[0, 0] == 7.0
    with pytest.raises(ValueError, match="Unsupported reduction"):
        indexing.scatter_update(base, [[0]], np.ones((1, 2)), "mean")


def test_slice_and_slice_update():
    x = np.arange(24).reshape(4, 6)
    np.testing.assert_array_equal(indexing.slice(x, [1, 2], [2, -1]), x[1:3, 2:])
    start = core.convert_to_tensor(np.array([3, 4], np.int32))
    # Starts clamp so the window fits, as XLA's dynamic_slice.
    np.testing.assert_array_equal(indexing.slice(x, start, [2, 3]), x[2:4, 3:6])
    got = indexing.slice_update(x, [1, 1], np.zeros((2, 2), np.int64))
    want = x.copy()
    want[1:3, 1:3] = 0
    np.testing.assert_array_equal(got, want)
    b = GraphBuilder()
    xt = b.new_input(ShapedArray((None, 6), np.float32))
    st = b.new_input(ShapedArray((2,), np.int32))
    assert indexing.slice(xt, st, (1, 3)).shape == (1, 3)
    assert indexing.slice(xt, (1, 1), (-1, -1)).shape == (None, 5)
    assert indexing.slice_update(xt, st, np.zeros((1, 2), np.float32)).shape == (None, 6)


def test_unstack():
    parts = indexing.unstack(X, axis=2)
    assert len(parts) == 4
    for i, p in enumerate(parts):
        np.testing.assert_array_equal(p, X[:, :, i])
    with pytest.raises(ValueError, match="Cannot infer argument `num`"):
        indexing.unstack(_traced((2, None)), axis=1)
    assert len(indexing.unstack(_traced((2, None)), num=3, axis=1)) == 3
