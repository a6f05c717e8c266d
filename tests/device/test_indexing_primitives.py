"""Indexing/structure/dynamic primitives: kernels against NumPy, shape rules
against kernels, and traced calls with unknown (None) dimensions."""

import numpy as np
import pytest

from keras_ipu.device.ir import ShapedArray
from keras_ipu.device.primitives import dynamic as dyn
from keras_ipu.device.primitives import indexing as ix
from keras_ipu.device.primitives import structure as st
from keras_ipu.device.primitives.shape_rules import ShapeError
from keras_ipu.device.trace import GraphBuilder

RNG = np.random.default_rng(0)
X = np.arange(2 * 3 * 4, dtype=np.float32).reshape(2, 3, 4)


def _aval(a):
    a = np.asarray(a)
    return ShapedArray(a.shape, a.dtype)


def run(prim, *args, **params):
    """Run eagerly and check the shape rule agrees with the kernel."""
    out = prim.bind(*args, **params)
    rule = prim.abstract_eval(*(_aval(a) for a in args), **params)
    outs = out if prim.multiple_results else (out,)
    rules = rule if prim.multiple_results else (rule,)
    for o, r in zip(outs, rules):
        o = np.asarray(o)
        if not prim.dynamic_shape:
            assert r.shape == o.shape, (prim, r, o.shape)
        assert r.dtype == o.dtype, (prim, r, o.dtype)
    return tuple(np.asarray(o) for o in outs) if prim.multiple_results else np.asarray(out)


# Shape rules run when tracing; eager binds go straight to the kernel, so
# rule errors are checked through abstract_eval.
def traced(prim, avals, *consts, **params):
    b = GraphBuilder()
    args = [b.new_input(a) for a in avals] + list(consts)
    out = prim.bind(*args, **params)
    return out


# ---------------------------------------------------------------- slice


@pytest.mark.parametrize(
    "start,limit,stride",
    [
        ((0, 1, 0), (2, 3, 4), (1, 1, 2)),
        ((1, None, -3), (None, -1, None), (1, 2, 1)),
        ((-5, 0, 10), (5, 3, 20), (1, 3, 1)),
    ],
)
def test_slice_matches_python_slices(start, limit, stride):
    got = run(ix.slice_p, X, start_indices=start, limit_indices=limit, strides=stride)
    want = X[tuple(slice(*a) for a in zip(start, limit, stride))]
    np.testing.assert_array_equal(got, want)


def test_slice_rejects_negative_stride():
    with pytest.raises(ShapeError, match="strides must be >= 1"):
        ix.slice_p.abstract_eval(
            _aval(X), start_indices=(0, 0, 0), limit_indices=(2, 3, 4), strides=(1, -1, 1)
        )


def test_slice_traced_none_dim():
    out = traced(
        ix.slice_p,
        [ShapedArray((None, 5), np.float32)],
        start_indices=(1, 1),
        limit_indices=(None, None),
        strides=(1, 2),
    )
    assert out.shape == (None, 2)


# --------------------------------------------------------- dynamic slice


def test_dynamic_slice_clamps_like_xla():
    x = np.arange(10)
    got = run(ix.dynamic_slice_p, x, np.int32(8), slice_sizes=(4,))
    np.testing.assert_array_equal(got, [6, 7, 8, 9])
    got = run(ix.dynamic_slice_p, x, np.int32(-3), slice_sizes=(2,))
    np.testing.assert_array_equal(got, [0, 1])


def test_dynamic_update_slice():
    x = np.zeros((3, 4), np.int32)
    upd = np.ones((2, 2), np.int32)
    got = run(ix.dynamic_update_slice_p, x, upd, np.int32(2), np.int32(1))
    want = x.copy()
    want[1:3, 1:3] = 1  # start 2 clamps to 1
    np.testing.assert_array_equal(got, want)
    # The operand is not mutated.
    assert x.sum() == 0


def test_dynamic_slice_traced():
    out = traced(
        ix.dynamic_slice_p,
        [ShapedArray((None, 6), np.float32), ShapedArray((), np.int32)],
        np.int32(0),
        slice_sizes=(1, 3),
    )
    assert out.shape == (1, 3)


# ---------------------------------------------------------------- gather


def test_gather_nd_with_negative_and_fill():
    idx = np.array([[0, 1], [1, -1], [5, 0]])
    got = run(ix.gather_p, X, idx, mode="fill")
    np.testing.assert_array_equal(got[0], X[0, 1])
    np.testing.assert_array_equal(got[1], X[1, -1])
    assert np.isnan(got[2]).all()
    clipped = run(ix.gather_p, X, idx, mode="clip")
    np.testing.assert_array_equal(clipped[2], X[1, 0])


def test_gather_fill_int_dtype_uses_extreme():
    got = run(ix.gather_p, np.arange(4, dtype=np.int32), np.array([[7]]), mode="fill")
    assert got[0] == np.iinfo(np.int32).min


def test_gather_batch_dims_is_take_along_axis():
    x = RNG.standard_normal((3, 5)).astype(np.float32)
    idx = RNG.integers(0, 5, (3, 4))
    got = run(ix.gather_p, x, idx[..., None], mode="clip", batch_dims=1)
    np.testing.assert_array_equal(got, np.take_along_axis(x, idx, axis=1))


def test_gather_traced_none_dims():
    out = traced(
        ix.gather_p,
        [ShapedArray((None, 7, 3), np.float32), ShapedArray((None, 2, 1), np.int32)],
        mode="clip",
        batch_dims=1,
    )
    assert out.shape == (None, 2, 3)


def test_gather_rejects_float_indices():
    with pytest.raises(TypeError, match="integers"):
        ix.gather_p.abstract_eval(_aval(X), _aval(np.zeros((1, 1), np.float32)), mode="clip")


# --------------------------------------------------------------- scatter


@pytest.mark.parametrize(
    "mode,ufunc",
    [("add", np.add), ("mul", np.multiply), ("min", np.minimum), ("max", np.maximum)],
)
def test_scatter_combines_duplicates(mode, ufunc):
    x = np.full((4, 2), 2.0, np.float32)
    idx = np.array([[0], [0], [3], [-1], [9]])  # -1 is row 3; 9 is dropped
    upd = np.arange(10, dtype=np.float32).reshape(5, 2)
    got = run(ix.scatter_p, x, idx, upd, mode=mode)
    want = x.copy()
    ufunc.at(want, np.array([0, 0, 3, 3]), upd[:4])
    np.testing.assert_array_equal(got, want)


def test_scatter_update_and_batch_dims():
    x = np.zeros((2, 3), np.int32)
    idx = np.array([[[2]], [[0]]])
    upd = np.array([[5], [7]], np.int32)
    got = run(ix.scatter_p, x, idx, upd, mode="update", batch_dims=1)
    np.testing.assert_array_equal(got, [[0, 0, 5], [7, 0, 0]])


def test_scatter_shape_errors():
    with pytest.raises(ShapeError, match="need updates of shape"):
        ix.scatter_p.abstract_eval(
            _aval(X), _aval(np.zeros((2, 1), np.int32)), _aval(np.zeros((2, 4), np.float32)), mode="add"
        )
    with pytest.raises(TypeError, match="operand dtype"):
        ix.scatter_p.abstract_eval(
            _aval(X), _aval(np.zeros((2, 3), np.int32)), _aval(np.zeros((2,), np.int32)), mode="add"
        )


def test_scatter_traced():
    out = traced(
        ix.scatter_p,
        [ShapedArray((None, 4), np.float32), ShapedArray((5, 1), np.int32), ShapedArray((5, 4), np.float32)],
        mode="add",
    )
    assert out.shape == (None, 4)


# ------------------------------------------------------------- structure


def test_concatenate():
    a, b = X[:, :1], X[:, 1:]
    np.testing.assert_array_equal(run(st.concatenate_p, a, b, axis=1), X)
    out = traced(
        st.concatenate_p,
        [ShapedArray((None, 2), np.float32), ShapedArray((4, 3), np.float32)],
        axis=-1,
    )
    assert out.shape == (4, 5)
    with pytest.raises(ShapeError, match="other dimensions must match"):
        st.concatenate_p.abstract_eval(_aval(X), _aval(X[:1, :2]), axis=0)


@pytest.mark.parametrize(
    "config",
    [
        ((1, 2, 0), (0, 0, 0), (2, 1, 0)),
        ((0, 0, 1), (1, 1, 2), (0, 0, 0)),
        ((-1, 1, 0), (0, -2, 1), (-1, -1, 0)),
        ((-1, -1, 2), (2, -3, 0), (0, 0, 3)),
    ],
)
def test_pad_matches_reference(config):
    got = run(st.pad_p, X, np.float32(-1), config=config)
    # Reference: interior then edges, element by element.
    ref = X
    for axis, (lo, hi, it) in enumerate(config):
        n = ref.shape[axis]
        idx = np.arange(n) * (it + 1)
        size = max(n + (n - 1) * it, 0)
        shape = list(ref.shape)
        shape[axis] = size
        grown = np.full(shape, -1, np.float32)
        sl = [slice(None)] * ref.ndim
        sl[axis] = idx
        grown[tuple(sl)] = ref
        pads = [(0, 0)] * ref.ndim
        pads[axis] = (max(lo, 0), max(hi, 0))
        grown = np.pad(grown, pads, constant_values=-1)
        sl = [slice(None)] * ref.ndim
        sl[axis] = slice(max(-lo, 0), grown.shape[axis] - max(-hi, 0))
        ref = grown[tuple(sl)]
    np.testing.assert_array_equal(got, ref)


def test_pad_traced_none():
    out = traced(
        st.pad_p,
        [ShapedArray((None, 3), np.float32)],
        np.float32(0),
        config=((1, 1, 0), (-1, 2, 1)),
    )
    assert out.shape == (None, 6)


def test_rev_and_iota():
    np.testing.assert_array_equal(run(st.rev_p, X, axes=(0, 2)), X[::-1, :, ::-1])
    got = run(st.iota_p, dtype=np.dtype("int32"), shape=(2, 3), dimension=1)
    np.testing.assert_array_equal(got, [[0, 1, 2], [0, 1, 2]])


# --------------------------------------------------------------- dynamic


def test_nonzero():
    x = np.array([[0, 1, 0], [2, 0, 3]])
    got = run(dyn.nonzero_p, x, index_dtype=np.dtype("int32"))
    for g, w in zip(got, np.nonzero(x)):
        np.testing.assert_array_equal(g, w)


def test_dynamic_primitives_refuse_tracing():
    with pytest.raises(NotImplementedError, match="static shapes"):
        traced(dyn.nonzero_p, [ShapedArray((None,), np.float32)], index_dtype=np.dtype("int32"))


def test_masked_select():
    mask = X[:, :, 0] > 4
    got = run(dyn.masked_select_p, X, mask)
    np.testing.assert_array_equal(got, X[mask])


def test_unique_and_sized():
    x = np.array([3, 1, 2, 1, 3, 3])
    v, idx, inv, cnt = run(dyn.unique_p, x, axis=None, index_dtype=np.dtype("int32"))
    wv, widx, winv, wcnt = np.unique(x, return_index=True, return_inverse=True, return_counts=True)
    for g, w in zip((v, idx, inv, cnt), (wv, widx, winv, wcnt)):
        np.testing.assert_array_equal(g, w)
    v, idx, inv, cnt = run(
        dyn.unique_sized_p, x, axis=None, index_dtype=np.dtype("int32"), size=5, fill_value=None
    )
    np.testing.assert_array_equal(v, [1, 2, 3, 1, 1])
    np.testing.assert_array_equal(cnt, [2, 1, 3, 0, 0])
    out = traced(
        dyn.unique_sized_p,
        [ShapedArray((None, 4), np.float32)],
        axis=0,
        index_dtype=np.dtype("int32"),
        size=3,
        fill_value=0.0,
    )
    assert [o.shape for o in out] == [(3, 4), (3,), (None,), (3,)]
