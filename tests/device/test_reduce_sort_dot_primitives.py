"""Reduction, cumulative, sort and dot_general primitives: kernels against
NumPy references, shape rules against kernel outputs (shape and dtype), and
traced calls with unknown (None) dimensions."""

import numpy as np
import pytest

from keras_ipu.device.array import Tensor
from keras_ipu.device.ir import ShapedArray
from keras_ipu.device.primitives import cumulative
from keras_ipu.device.primitives import reduce as red
from keras_ipu.device.primitives import shape_rules
from keras_ipu.device.primitives.dot import dot_general_p
from keras_ipu.device.primitives.sort import searchsorted_p
from keras_ipu.device.primitives.sort import sort_p
from keras_ipu.device.primitives.sort import top_k_p
from keras_ipu.device.trace import GraphBuilder

RNG = np.random.default_rng(0)


def _eager(prim, *args, **params):
    """Bind eagerly and check the shape rule agrees with the kernel."""
    out = prim.bind(*args, **params)
    avals = [ShapedArray(np.shape(a), np.asarray(a).dtype) for a in args]
    want = prim.abstract_eval(*avals, **params)
    outs = out if prim.multiple_results else (out,)
    wants = want if prim.multiple_results else (want,)
    for o, w in zip(outs, wants):
        assert isinstance(o, Tensor)
        assert o.dtype == w.dtype, (prim.name, o.dtype, w.dtype)
        assert all(
            d is None or d == s for d, s in zip(w.shape, o.shape)
        ) and len(w.shape) == len(o.shape), (prim.name, o.shape, w.shape)
    return [np.asarray(o) for o in outs] if prim.multiple_results else np.asarray(out)


def _traced(prim, *avals, **params):
    builder = GraphBuilder()
    tracers = [builder.new_input(a) for a in avals]
    out = prim.bind(*tracers, **params)
    if prim.multiple_results:
        return [o.aval for o in out]
    return out.aval


# ------------------------------------------------------------- cumulative


@pytest.mark.parametrize(
    "prim,ref",
    [
        (cumulative.cumsum_p, np.cumsum),
        (cumulative.cumprod_p, np.cumprod),
        (cumulative.cummax_p, np.maximum.accumulate),
        (cumulative.cummin_p, np.minimum.accumulate),
    ],
)
@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("reverse", [False, True])
def test_cumulative_matches_numpy(prim, ref, axis, reverse):
    x = RNG.standard_normal((3, 4, 5)).astype(np.float32)
    got = _eager(prim, x, axis=axis, reverse=reverse)
    if reverse:
        want = np.flip(ref(np.flip(x, axis), axis=axis), axis)
    else:
        want = ref(x, axis=axis)
    np.testing.assert_allclose(got, want, rtol=1e-5)


def test_cumsum_keeps_small_int_dtype():
    x = np.array([100, 100, 100], np.int8)
    out = _eager(cumulative.cumsum_p, x, axis=0)
    assert out.dtype == np.int8


def test_cumulative_traced_unknown_dim():
    aval = _traced(
        cumulative.cumsum_p, ShapedArray((None, 4), np.float32), axis=0
    )
    assert aval == ShapedArray((None, 4), np.float32)


def test_cumulative_bad_axis():
    with pytest.raises(shape_rules.ShapeError):
        _traced(cumulative.cumsum_p, ShapedArray((3,), np.float32), axis=2)


# ------------------------------------------------------------------- sort


def test_sort_nan_last_and_stable():
    x = np.array([[3.0, np.nan, 1.0, 3.0, -np.inf]], np.float32)
    idx = np.broadcast_to(np.arange(5), x.shape).astype(np.int32)
    vals, order = _eager(sort_p, x, idx, dimension=1)
    np.testing.assert_array_equal(vals, np.sort(x, axis=1))
    np.testing.assert_array_equal(order, [[4, 2, 0, 3, 1]])


def test_sort_descending_is_reverse_order_and_stable():
    x = np.array([2, 5, 2, 7, 5], np.int32)
    idx = np.arange(5, dtype=np.int32)
    vals, order = _eager(sort_p, x, idx, dimension=0, descending=True)
    np.testing.assert_array_equal(vals, [7, 5, 5, 2, 2])
    # Equal keys keep their original order.
    np.testing.assert_array_equal(order, [3, 1, 4, 0, 2])


def test_sort_two_keys():
    k1 = np.array([1, 0, 1, 0], np.int32)
    k2 = np.array([4, 3, 2, 1], np.int32)
    payload = np.array([10, 11, 12, 13], np.int32)
    a, c, p = _eager(sort_p, k1, k2, payload, dimension=0, num_keys=2)
    np.testing.assert_array_equal(p, [13, 11, 12, 10])
    np.testing.assert_array_equal(a, [0, 0, 1, 1])
    np.testing.assert_array_equal(c, [1, 3, 2, 4])


@pytest.mark.parametrize("axis", [0, 1, 2])
def test_sort_random_matches_numpy(axis):
    x = RNG.standard_normal((4, 5, 6)).astype(np.float32)
    (vals,) = _eager(sort_p, x, dimension=axis)
    np.testing.assert_array_equal(vals, np.sort(x, axis=axis))


def test_sort_traced_unknown_dim():
    avals = _traced(
        sort_p,
        ShapedArray((None, 7), np.float32),
        ShapedArray((None, 7), np.int32),
        dimension=1,
    )
    assert avals == [
        ShapedArray((None, 7), np.float32),
        ShapedArray((None, 7), np.int32),
    ]


def test_sort_rejects_mismatched_operands():
    with pytest.raises(shape_rules.ShapeError):
        _traced(
            sort_p,
            ShapedArray((3, 7), np.float32),
            ShapedArray((3, 6), np.int32),
            dimension=1,
        )


def test_top_k_values_indices_and_ties():
    x = np.array([[1.0, 4.0, 4.0, 2.0, 9.0], [0.0, -1.0, 3.0, 3.0, 3.0]], np.float32)
    vals, idx = _eager(top_k_p, x, k=3)
    np.testing.assert_array_equal(vals, [[9, 4, 4], [3, 3, 3]])
    np.testing.assert_array_equal(idx, [[4, 1, 2], [2, 3, 4]])
    assert idx.dtype == np.int32


def test_top_k_random_matches_argsort():
    x = RNG.standard_normal((6, 50)).astype(np.float32)
    vals, idx = _eager(top_k_p, x, k=5)
    want = np.argsort(-x, axis=-1, kind="stable")[:, :5]
    np.testing.assert_array_equal(idx, want)
    np.testing.assert_array_equal(vals, np.take_along_axis(x, want, -1))


def test_top_k_traced_and_errors():
    avals = _traced(top_k_p, ShapedArray((None, 10), np.float32), k=3)
    assert avals == [
        ShapedArray((None, 3), np.float32),
        ShapedArray((None, 3), np.int32),
    ]
    with pytest.raises(shape_rules.ShapeError, match="k=11"):
        _traced(top_k_p, ShapedArray((2, 10), np.float32), k=11)


@pytest.mark.parametrize("side", ["left", "right"])
def test_searchsorted(side):
    seq = np.array([0.0, 1.0, 1.0, 2.5, np.nan], np.float32)
    vals = np.array([[-1.0, 1.0], [2.0, 9.0]], np.float32)
    got = _eager(searchsorted_p, seq, vals, side=side)
    np.testing.assert_array_equal(got, np.searchsorted(seq, vals, side=side))
    aval = _traced(
        searchsorted_p,
        ShapedArray((None,), np.float32),
        ShapedArray((None, 3), np.float32),
        side=side,
    )
    assert aval == ShapedArray((None, 3), np.int32)


def test_searchsorted_rejects_nd_sequence():
    with pytest.raises(shape_rules.ShapeError, match="1-D"):
        _traced(
            searchsorted_p,
            ShapedArray((2, 3), np.float32),
            ShapedArray((3,), np.float32),
        )


# ------------------------------------------------------------ dot_general

DOT_CASES = [
    # lhs shape, rhs shape, dimension_numbers, numpy einsum reference
    ((3, 4), (4, 5), (((1,), (0,)), ((), ())), "ik,kj->ij"),
    ((2, 3, 4), (2, 4, 5), (((2,), (1,)), ((0,), (0,))), "bik,bkj->bij"),
    ((4, 3), (5, 4), (((0,), (1,)), ((), ())), "ki,jk->ij"),
    ((2, 3, 4, 5), (5, 4, 2), (((2, 3), (1, 0)), ((0,), (2,))), "bikl,lkb->bi"),
    ((3,), (3,), (((0,), (0,)), ((), ())), "i,i->"),
    ((3,), (4,), (((), ()), ((), ())), "i,j->ij"),
    ((2, 0, 3), (2, 3, 4), (((2,), (1,)), ((0,), (0,))), "bik,bkj->bij"),
]


@pytest.mark.parametrize("lhs_shape,rhs_shape,dims,spec", DOT_CASES)
def test_dot_general_matches_einsum(lhs_shape, rhs_shape, dims, spec):
    lhs = RNG.standard_normal(lhs_shape).astype(np.float32)
    rhs = RNG.standard_normal(rhs_shape).astype(np.float32)
    got = _eager(dot_general_p, lhs, rhs, dimension_numbers=dims)
    np.testing.assert_allclose(got, np.einsum(spec, lhs, rhs), rtol=1e-5, atol=1e-5)


def test_dot_general_int8_prefers_int32():
    lhs = np.full((2, 64), 100, np.int8)
    rhs = np.full((64, 3), 100, np.int8)
    got = _eager(
        dot_general_p,
        lhs,
        rhs,
        dimension_numbers=(((1,), (0,)), ((), ())),
        preferred_element_type=np.dtype(np.int32),
    )
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, np.full((2, 3), 640000))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_dot_general_half_types_keep_dtype(dtype):
    import ml_dtypes  # noqa: F401

    dt = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    lhs = RNG.standard_normal((4, 8)).astype(dt)
    rhs = RNG.standard_normal((8, 2)).astype(dt)
    got = _eager(dot_general_p, lhs, rhs, dimension_numbers=(((1,), (0,)), ((), ())))
    assert got.dtype == dt
    want = lhs.astype(np.float32) @ rhs.astype(np.float32)
    np.testing.assert_allclose(got.astype(np.float32), want, rtol=3e-2, atol=3e-2)


def test_dot_general_traced_unknown_dims():
    aval = _traced(
        dot_general_p,
        ShapedArray((None, 3, 4), np.float32),
        ShapedArray((None, 4, 6), np.float32),
        dimension_numbers=(((2,), (1,)), ((0,), (0,))),
    )
    assert aval == ShapedArray((None, 3, 6), np.float32)
    aval = _traced(
        dot_general_p,
        ShapedArray((5, None), np.float32),
        ShapedArray((7, 5), np.float32),
        dimension_numbers=(((0,), (1,)), ((), ())),
    )
    assert aval == ShapedArray((None, 7), np.float32)


def test_dot_general_shape_errors():
    with pytest.raises(shape_rules.ShapeError, match="contracting"):
        _traced(
            dot_general_p,
            ShapedArray((3, 4), np.float32),
            ShapedArray((5, 6), np.float32),
            dimension_numbers=(((1,), (0,)), ((), ())),
        )
    with pytest.raises(TypeError, match="dtype"):
        _traced(
            dot_general_p,
            ShapedArray((3, 4), np.float32),
            ShapedArray((4, 6), np.int32),
            dimension_numbers=(((1,), (0,)), ((), ())),
        )


# --------------------------------------------------------------- bincount


def test_bincount_rows_and_weights():
    x = np.array([[1, 1, 3], [0, 2, 2]], np.int32)
    w = np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], np.float32)
    got = red.bincount_p.bind(x, w, minlength=6)
    np.testing.assert_array_equal(
        got, [[0, 3, 0, 3, 0, 0], [4, 0, 11, 0, 0, 0]]
    )
    assert got.dtype == np.float32
    one_d = red.bincount_p.bind(x[0], np.ones(3, np.int32), minlength=0)
    np.testing.assert_array_equal(one_d, np.bincount(x[0]))


def test_bincount_is_eager_only():
    builder = GraphBuilder()
    t = builder.new_input(ShapedArray((None,), np.int32))
    with pytest.raises(NotImplementedError, match="static shapes"):
        red.bincount_p.bind(t, t, minlength=0)


def test_bincount_rejects_negative_values():
    with pytest.raises(ValueError, match="non-negative"):
        red.bincount_p.bind(np.array([1, -1]), np.ones(2, np.int32), minlength=0)
