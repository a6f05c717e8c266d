"""Array creation/manipulation ops of the ipu backend against NumPy, and
their traced shapes with unknown (None) dimensions."""

import os

os.environ.setdefault("KERAS_BACKEND", "ipu")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from keras_ipu.backend import core  # noqa: E402
from keras_ipu.backend.numpy import arrays as A  # noqa: E402

RNG = np.random.default_rng(0)
X = RNG.standard_normal((2, 3, 4)).astype(np.float32)
M = np.arange(12).reshape(3, 4)


def check(got, want):
    got = [np.asarray(g) for g in got] if isinstance(got, (list, tuple)) else np.asarray(got)
    if isinstance(want, (list, tuple)):
        assert len(got) == len(want)
        for g, w in zip(got, want):
            check(g, w)
        return
    want = np.asarray(want)
    assert got.shape == want.shape, (got.shape, want.shape)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


CASES = [
    ("reshape", lambda m: m.reshape(M, (2, -1)), lambda: M.reshape(2, -1)),
    ("ravel", lambda m: m.ravel(X), lambda: X.ravel()),
    ("squeeze", lambda m: m.squeeze(X[:1, :, :1]), lambda: np.squeeze(X[:1, :, :1])),
    ("squeeze_axis", lambda m: m.squeeze(X[:1], 0), lambda: X[0]),
    ("expand_dims", lambda m: m.expand_dims(X, (0, -1)), lambda: np.expand_dims(X, (0, -1))),
    ("transpose", lambda m: m.transpose(X, (2, 0, 1)), lambda: X.transpose(2, 0, 1)),
    ("swapaxes", lambda m: m.swapaxes(X, 0, 2), lambda: np.swapaxes(X, 0, 2)),
    ("moveaxis", lambda m: m.moveaxis(X, (0, 1), (2, 0)), lambda: np.moveaxis(X, (0, 1), (2, 0))),
    ("broadcast_to", lambda m: m.broadcast_to(X[:, :1], (5, 2, 3, 4)), lambda: np.broadcast_to(X[:, :1], (5, 2, 3, 4))),
    ("flip", lambda m: m.flip(X, (0, 2)), lambda: np.flip(X, (0, 2))),
    ("fliplr", lambda m: m.fliplr(M), lambda: np.fliplr(M)),
    ("roll", lambda m: m.roll(M, 5), lambda: np.roll(M, 5)),
    ("roll_axes", lambda m: m.roll(X, (1, -2), (0, 2)), lambda: np.roll(X, (1, -2), (0, 2))),
    ("rot90", lambda m: m.rot90(X, 3, (2, 1)), lambda: np.rot90(X, 3, (2, 1))),
    ("tile", lambda m: m.tile(M, (2, 1, 3)), lambda: np.tile(M, (2, 1, 3))),
    ("repeat", lambda m: m.repeat(M, 2, axis=1), lambda: np.repeat(M, 2, axis=1)),
    ("repeat_counts", lambda m: m.repeat(M, [1, 0, 3], axis=0), lambda: np.repeat(M, [1, 0, 3], axis=0)),
    ("pad_const", lambda m: m.pad(M, ((1, 2), (0, 3)), constant_values=7), lambda: np.pad(M, ((1, 2), (0, 3)), constant_values=7)),
    ("pad_reflect", lambda m: m.pad(M, (2, 1), mode="reflect"), lambda: np.pad(M, (2, 1), mode="reflect")),
    ("pad_symmetric", lambda m: m.pad(X, 1, mode="symmetric"), lambda: np.pad(X, 1, mode="symmetric")),
    ("pad_edge", lambda m: m.pad(M, ((0, 2), (1, 0)), mode="edge"), lambda: np.pad(M, ((0, 2), (1, 0)), mode="edge")),
    ("pad_wrap", lambda m: m.pad(M, 2, mode="wrap"), lambda: np.pad(M, 2, mode="wrap")),
    ("take", lambda m: m.take(X, np.array([[2, -1]]), axis=2), lambda: np.take(X, [[2, -1]], axis=2)),
    ("take_flat", lambda m: m.take(M, [11, 0]), lambda: np.take(M, [11, 0])),
    ("take_along", lambda m: m.take_along_axis(X, np.argsort(X, axis=1), 1), lambda: np.take_along_axis(X, np.argsort(X, axis=1), 1)),
    ("take_along_bcast", lambda m: m.take_along_axis(X, np.array([[[0], [3], [1]]]), -1), lambda: np.take_along_axis(X, np.broadcast_to(np.array([[[0], [3], [1]]]), (2, 3, 1)), -1)),
    ("concatenate", lambda m: m.concatenate([X, X[:1]], 0), lambda: np.concatenate([X, X[:1]], 0)),
    ("concatenate_none", lambda m: m.concatenate([M, X], None), lambda: np.concatenate([M.ravel(), X.ravel()])),
    ("append", lambda m: m.append(M, M, axis=1), lambda: np.append(M, M, axis=1)),
    ("stack", lambda m: m.stack([M, M + 1], -1), lambda: np.stack([M, M + 1], -1)),
    ("hstack", lambda m: m.hstack([M, M]), lambda: np.hstack([M, M])),
    ("vstack", lambda m: m.vstack([np.arange(3), np.arange(3)]), lambda: np.vstack([np.arange(3), np.arange(3)])),
    ("dstack", lambda m: m.dstack([M, M]), lambda: np.dstack([M, M])),
    ("split", lambda m: m.split(M, [1, 3], axis=1), lambda: np.split(M, [1, 3], axis=1)),
    ("array_split", lambda m: m.array_split(np.arange(10), 3), lambda: np.array_split(np.arange(10), 3)),
    ("hsplit", lambda m: m.hsplit(M, 2), lambda: np.hsplit(M, 2)),
    ("vsplit", lambda m: m.vsplit(M, 3), lambda: np.vsplit(M, 3)),
    ("dsplit", lambda m: m.dsplit(X, [1]), lambda: np.dsplit(X, [1])),
    ("diag_1d", lambda m: m.diag(np.arange(1, 4), -2), lambda: np.diag(np.arange(1, 4), -2)),
    ("diag_2d", lambda m: m.diag(M, 1), lambda: np.diag(M, 1)),
    ("diagflat", lambda m: m.diagflat([[1, 2], [3, 4]], 1), lambda: np.diagflat([[1, 2], [3, 4]], 1)),
    ("diagonal", lambda m: m.diagonal(X, -1, 2, 1), lambda: np.diagonal(X, -1, 2, 1)),
    ("tril", lambda m: m.tril(X, -1), lambda: np.tril(X, -1)),
    ("triu", lambda m: m.triu(M, 1), lambda: np.triu(M, 1)),
    ("meshgrid_xy", lambda m: m.meshgrid(np.arange(2), np.arange(3), np.arange(4)), lambda: np.meshgrid(np.arange(2), np.arange(3), np.arange(4))),
    ("meshgrid_ij", lambda m: m.meshgrid(np.arange(2), np.arange(3), indexing="ij"), lambda: np.meshgrid(np.arange(2), np.arange(3), indexing="ij")),
    ("linspace", lambda m: m.linspace(0, 1, 7), lambda: np.linspace(0, 1, 7)),
    ("linspace_arrays", lambda m: m.linspace([0, 1], [2, -3], 4, endpoint=False, axis=-1), lambda: np.linspace([0, 1], [2, -3], 4, endpoint=False, axis=-1)),
    ("logspace", lambda m: m.logspace(0, 2, 5, base=2), lambda: np.logspace(0, 2, 5, base=2)),
    ("geomspace", lambda m: m.geomspace(1, 1000, 4), lambda: np.geomspace(1, 1000, 4)),
    ("geomspace_neg", lambda m: m.geomspace(-1, -16, 5), lambda: np.geomspace(-1, -16, 5)),
    ("arange", lambda m: m.arange(2, 11, 3), lambda: np.arange(2, 11, 3)),
    ("eye", lambda m: m.eye(3, 4, k=-1), lambda: np.eye(3, 4, k=-1)),
    ("tri", lambda m: m.tri(3, 2, 1), lambda: np.tri(3, 2, 1)),
    ("full", lambda m: m.full((2, 3), np.array([1, 4, 5])), lambda: np.full((2, 3), [1, 4, 5])),
    ("unravel_index", lambda m: m.unravel_index(np.array([5, 11]), (3, 4)), lambda: np.unravel_index([5, 11], (3, 4))),
    ("kron", lambda m: m.kron(M[:2, :2], np.array([[1, 10], [100, 1000]])), lambda: np.kron(M[:2, :2], [[1, 10], [100, 1000]])),
    ("vander", lambda m: m.vander(np.array([1.0, 2.0, 3.0]), 4), lambda: np.vander([1.0, 2.0, 3.0], 4)),
    ("vander_inc", lambda m: m.vander(np.array([2, 3]), increasing=True), lambda: np.vander([2, 3], increasing=True)),
    ("kaiser", lambda m: m.kaiser(6, 2.5), lambda: np.kaiser(6, 2.5)),
    ("hanning", lambda m: m.hanning(5), lambda: np.hanning(5)),
    ("nonzero", lambda m: m.nonzero(M % 3 == 0), lambda: np.nonzero(M % 3 == 0)),
]


@pytest.mark.parametrize("name,fn,ref", CASES, ids=[c[0] for c in CASES])
def test_matches_numpy(name, fn, ref):
    check(fn(A), ref())


def test_dtypes_follow_keras_rules():
    assert A.arange(3).dtype == np.int32
    assert A.arange(0.5, 3).dtype == np.float32
    assert A.ones((2,)).dtype == np.float32
    assert A.full((2,), 1).dtype == np.float32
    assert A.full_like(np.zeros(2, np.int8), 3.7).dtype == np.int8
    assert A.concatenate([np.zeros(1, np.int8), np.zeros(1, np.uint8)]).dtype == np.int16
    assert A.linspace(0, 10, 3).dtype == np.float32
    assert A.vander(np.array([1, 2], np.int32)).dtype == np.int32
    assert A.nonzero(np.ones(3))[0].dtype == np.int32
    assert A.bartlett(5.0).dtype == np.float32


def test_unique_like_keras():
    x = np.array([3, 1, 2, 1])
    v, idx, inv, c = A.unique(x, return_index=True, return_inverse=True, return_counts=True)
    check([v, idx, inv, c], [[1, 2, 3], [1, 2, 0], [2, 0, 1, 0], [2, 1, 1]])
    v, c = A.unique(x, size=5, fill_value=-1, return_counts=True)
    check([v, c], [[1, 2, 3, -1, -1], [2, 1, 1, 0, 0]])
    v, inv = A.unique(np.array([[1, 0], [0, 1], [1, 0]]), axis=0, return_inverse=True)
    check([v, inv], [[[0, 1], [1, 0]], [1, 0, 1]])


def test_errors_name_the_fix():
    with pytest.raises(ValueError, match="equal division"):
        A.split(np.arange(5), 2)
    with pytest.raises(TypeError):
        A.eye(3.0)
    with pytest.raises(ValueError, match="at most one unknown"):
        A.reshape(M, (-1, -1))
    with pytest.raises(ValueError, match="out of bounds"):
        A.moveaxis(M, 3, 0)
    with pytest.raises(ValueError, match="size-1 axes"):
        A.squeeze(M, 0)


# ----------------------------------------------------------------- traced


def spec(fn, *shapes):
    """Output shape(s) of fn traced on KerasTensors; a shape given as
    (shape, dtype) sets that input's dtype (default float32)."""
    args = [
        keras.KerasTensor(*s) if isinstance(s[-1], str) else keras.KerasTensor(s)
        for s in shapes
    ]
    out = core.compute_output_spec(fn, *args)
    return [o.shape for o in out] if isinstance(out, (list, tuple)) else out.shape


@pytest.mark.parametrize(
    "fn,shapes,want",
    [
        (lambda x: A.ravel(x), [(None, 3)], (None,)),
        (lambda x: A.expand_dims(x, 1), [(None, 3)], (None, 1, 3)),
        (lambda x: A.squeeze(x), [(None, 1, 3)], (None, 3)),
        (lambda x: A.transpose(x), [(None, 3)], (3, None)),
        (lambda x: A.flip(x, 0), [(None, 3)], (None, 3)),
        (lambda x: A.roll(x, 2, 1), [(None, 3)], (None, 3)),
        (lambda x: A.tile(x, (2, 2)), [(None, 3)], (None, 6)),
        (lambda x: A.repeat(x, 3, axis=0), [(None, 3)], (None, 3)),
        (lambda x: A.repeat(x, 2, axis=1), [(None, 3)], (None, 6)),
        (lambda x: A.pad(x, ((1, 2), (3, 4))), [(None, 3)], (None, 10)),
        (lambda x: A.pad(x, 1, mode="reflect"), [(2, 3)], (4, 5)),
        (lambda x: A.concatenate([x, x], 1), [(None, 3)], (None, 6)),
        (lambda x: A.stack([x, x], 1), [(None, 3)], (None, 2, 3)),
        (lambda x: A.split(x, 3, axis=1), [(None, 3)], [(None, 1)] * 3),
        (lambda x: A.take(x, np.array([[0, 2]]), axis=1), [(None, 3)], (None, 1, 2)),
        (lambda x, i: A.take_along_axis(x, i, 1), [(None, 3), ((None, 5), "int32")], (None, 5)),
        (lambda x: A.zeros_like(x), [(None, 3)], (None, 3)),
        (lambda x: A.full_like(x, 2.0), [(None, 3)], (None, 3)),
        (lambda x: A.tril(x), [(None, 3, 3)], (None, 3, 3)),
        (lambda x: A.diagonal(x, 0, 1, 2), [(None, 3, 4)], (None, 3)),
        (lambda x: A.moveaxis(x, 0, -1), [(None, 3)], (3, None)),
        (lambda x: A.broadcast_to(x, (4, 2, 3)), [(2, 3)], (4, 2, 3)),
        (lambda x: A.kron(x, x), [(2, None)], (4, None)),
        (lambda x, y: A.linspace(x, y, 5, axis=1), [(None, 3), (None, 3)], (None, 5, 3)),
    ],
)
def test_traced_shapes(fn, shapes, want):
    assert spec(fn, *shapes) == want


def test_traced_dynamic_ops_are_refused():
    with pytest.raises(NotImplementedError, match="static shapes"):
        spec(lambda x: A.nonzero(x), (None, 3))
    assert spec(lambda x: A.unique(x, size=4), (None, 3)) == (4,)
