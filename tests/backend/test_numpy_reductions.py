"""Reductions, statistics, sorting and products of keras.ops.numpy on the
ipu backend: values against NumPy, Keras' dtype rules, and traced calls
whose inputs have unknown (None) dimensions."""

import numpy as np
import pytest

import keras  # noqa: F401  (tests/conftest.py selects the ipu backend)
from keras.src.backend.common.keras_tensor import KerasTensor

from keras_ipu.backend import numpy as knp
from keras_ipu.backend.core import compute_output_spec
from keras_ipu.device.ir import ShapedArray
from keras_ipu.device.trace import GraphBuilder
from keras_ipu.device.trace import tracing

RNG = np.random.default_rng(1)
X = RNG.standard_normal((3, 4, 5)).astype(np.float32)
XN = X.copy()
XN[0, 1, 2] = np.nan
XN[1, :, 3] = np.nan  # an all-NaN slice along axis 1


def close(got, want, atol=1e-5, rtol=1e-5):
    got = np.asarray(got)
    want = np.asarray(want)
    assert got.shape == want.shape, (got.shape, want.shape)
    np.testing.assert_allclose(got, want, atol=atol, rtol=rtol, equal_nan=True)


# ------------------------------------------------------------- reductions

REDUCTIONS = [
    ("sum", np.sum),
    ("prod", np.prod),
    ("mean", np.mean),
    ("max", np.max),
    ("min", np.min),
    ("amax", np.amax),
    ("amin", np.amin),
    ("std", np.std),
    ("var", np.var),
    ("ptp", np.ptp),
    ("median", np.median),
]


@pytest.mark.parametrize("name,ref", REDUCTIONS)
@pytest.mark.parametrize("axis", [None, 0, -1, (0, 2)])
@pytest.mark.parametrize("keepdims", [False, True])
def test_reduction_matches_numpy(name, ref, axis, keepdims):
    got = getattr(knp, name)(X, axis=axis, keepdims=keepdims)
    close(got, ref(X, axis=axis, keepdims=keepdims), rtol=1e-4)


NAN_REDUCTIONS = [
    ("nansum", np.nansum),
    ("nanprod", np.nanprod),
    ("nanmean", np.nanmean),
    ("nanmax", np.nanmax),
    ("nanmin", np.nanmin),
    ("nanstd", np.nanstd),
    ("nanvar", np.nanvar),
    ("nanmedian", np.nanmedian),
]


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("name,ref", NAN_REDUCTIONS)
@pytest.mark.parametrize("axis", [None, 1, (0, 2)])
def test_nan_reduction_matches_numpy(name, ref, axis):
    got = getattr(knp, name)(XN, axis=axis)
    close(got, ref(XN, axis=axis), rtol=1e-4)


@pytest.mark.parametrize("name", ["argmax", "argmin"])
@pytest.mark.parametrize("axis", [None, 0, 2])
def test_arg_extremes(name, axis):
    got = getattr(knp, name)(X, axis=axis)
    close(got, getattr(np, name)(X, axis=axis))
    assert got.dtype == np.int32


def test_argmax_prefers_positive_zero():
    x = np.array([-0.0, 0.0, -1.0], np.float32)
    assert int(knp.argmax(x)) == 1
    assert int(knp.argmin(np.array([0.0, -0.0, 1.0], np.float32))) == 1


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_nanargmax_all_nan_slice_is_minus_one():
    x = np.array([[np.nan, np.nan], [1.0, np.nan], [np.nan, 3.0]], np.float32)
    close(knp.nanargmax(x, axis=1), [-1, 0, 1])
    close(knp.nanargmin(x, axis=1), [-1, 0, 1])


def test_max_with_initial_on_empty_and_full():
    close(knp.max(np.zeros((1, 0)), initial=1.0), 1.0)
    close(knp.max(X, axis=1, initial=0.5), np.max(X, axis=1, initial=0.5))
    close(knp.min(X, axis=(), initial=0.0), np.minimum(X, 0.0))
    with pytest.raises(ValueError, match="initial"):
        knp.max(np.zeros((2, 0)), axis=1)


def test_all_any_count_nonzero():
    b = np.array([[0, 1, 2], [0, 0, 0]])
    close(knp.all(b, axis=1), np.all(b, axis=1))
    close(knp.any(b, axis=1), np.any(b, axis=1))
    close(knp.count_nonzero(b, axis=0), np.count_nonzero(b, axis=0))
    assert knp.count_nonzero(b).dtype == np.int32


@pytest.mark.parametrize(
    "name,ref", [("cumsum", np.cumsum), ("cumprod", np.cumprod)]
)
@pytest.mark.parametrize("axis", [None, 0, 2])
def test_cumulative(name, ref, axis):
    close(getattr(knp, name)(X, axis=axis), ref(X, axis=axis), rtol=1e-4)


def test_nan_cumulative():
    close(knp.nancumsum(XN, axis=1), np.nancumsum(XN, axis=1))
    close(knp.nancumprod(XN, axis=2), np.nancumprod(XN, axis=2), rtol=1e-4)


@pytest.mark.parametrize("n,axis", [(1, -1), (2, 0), (3, 1), (0, 1)])
def test_diff(n, axis):
    close(knp.diff(X, n=n, axis=axis), np.diff(X, n=n, axis=axis))


def test_diff_bool_is_not_equal():
    x = np.array([True, True, False, True])
    close(knp.diff(x), np.diff(x))


@pytest.mark.parametrize("offset", [-2, 0, 1, 7])
@pytest.mark.parametrize("axes", [(0, 1), (2, 0), (1, 2)])
def test_trace(offset, axes):
    got = knp.trace(X, offset=offset, axis1=axes[0], axis2=axes[1])
    close(got, np.trace(X, offset=offset, axis1=axes[0], axis2=axes[1]))


# ------------------------------------------------------------ statistics


@pytest.mark.parametrize("method", ["linear", "lower", "higher", "midpoint", "nearest"])
@pytest.mark.parametrize("axis", [None, 1, (0, 2)])
@pytest.mark.parametrize("keepdims", [False, True])
def test_quantile(method, axis, keepdims):
    q = np.array([0.0, 0.25, 0.501, 1.0], np.float32)
    got = knp.quantile(X, q, axis=axis, method=method, keepdims=keepdims)
    want = np.quantile(X, q, axis=axis, method=method, keepdims=keepdims)
    close(got, want)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("method", ["linear", "lower", "higher", "midpoint", "nearest"])
def test_nanquantile_and_percentile(method):
    q = np.array([0.1, 0.75], np.float32)
    got = knp.nanquantile(XN, q, axis=1, method=method)
    close(got, np.nanquantile(XN, q, axis=1, method=method))
    got = knp.nanpercentile(XN, 100 * q, axis=1, method=method)
    close(got, np.nanpercentile(XN, 100 * q, axis=1, method=method), atol=1e-4)
    close(knp.percentile(X, 30, axis=0), np.percentile(X, 30, axis=0))


def test_quantile_propagates_nan_and_keeps_inf():
    close(knp.quantile(XN, 0.5, axis=1), np.quantile(XN, 0.5, axis=1))
    x = np.array([[1.0, np.inf, 3.0], [-np.inf, 2.0, 5.0]], np.float32)
    close(knp.median(x, axis=1), np.median(x, axis=1))


def test_average():
    w = np.arange(1.0, 5.0)
    close(knp.average(X, axis=1, weights=w), np.average(X, axis=1, weights=w))
    w3 = RNG.random(X.shape)
    close(knp.average(X, weights=w3), np.average(X, weights=w3), rtol=1e-4)
    close(knp.average(X, axis=0), np.average(X, axis=0))
    with pytest.raises(ValueError, match="weights"):
        knp.average(X, weights=np.ones(4))


@pytest.mark.parametrize("n,m", [(7, 3), (3, 7), (4, 4), (1, 5), (6, 1)])
@pytest.mark.parametrize("mode", ["valid", "same", "full"])
def test_correlate(n, m, mode):
    a = RNG.standard_normal(n)
    v = RNG.standard_normal(m)
    close(knp.correlate(a, v, mode=mode), np.correlate(a, v, mode), atol=1e-4)


def test_corrcoef():
    close(knp.corrcoef(X[0]), np.corrcoef(X[0]), atol=1e-5)
    close(knp.corrcoef(X[0, 0]), np.corrcoef(X[0, 0]))


def test_trapezoid():
    close(knp.trapezoid(X, dx=0.5, axis=1), np.trapezoid(X, dx=0.5, axis=1))
    xs = np.arange(5.0) ** 2
    close(knp.trapezoid(X, x=xs), np.trapezoid(X, x=xs), rtol=1e-4)
    xs3 = np.cumsum(RNG.random(X.shape), axis=0)
    close(knp.trapezoid(X, x=xs3, axis=0), np.trapezoid(X, x=xs3, axis=0), rtol=1e-4)


@pytest.mark.parametrize(
    "bins,range_", [(10, None), (5, None), (4, (0.2, 0.6)), (3, (0.0, 0.0))]
)
def test_histogram(bins, range_):
    x = np.concatenate([RNG.random(30), [0.0, 1.0, 0.6]])
    counts, edges = knp.histogram(x, bins=bins, range=range_)
    want_counts, want_edges = np.histogram(x, bins=bins, range=range_)
    close(counts, want_counts)
    close(edges, want_edges)


def test_bincount():
    x = np.array([1, 1, 2, 3, 2, 4, 4, 6])
    w = np.array([0, 0, 3, 2, 1, 1, 4, 2])
    close(knp.bincount(x, minlength=9), np.bincount(x, minlength=9))
    close(knp.bincount(x, weights=w), np.bincount(x, weights=w))
    close(knp.bincount(x[None], weights=w[None], minlength=3), [[0, 0, 4, 2, 5, 0, 2]])
    assert knp.bincount(x).dtype == np.int32


# ----------------------------------------------------------------- sorting


@pytest.mark.parametrize("axis", [None, 0, 1, -1])
def test_sort_argsort_argpartition(axis):
    close(knp.sort(XN, axis=axis), np.sort(XN, axis=axis))
    close(knp.argsort(X, axis=axis), np.argsort(X, axis=axis, kind="stable"))
    part = np.asarray(knp.argpartition(X, 2, axis=axis))
    flat = X.reshape(-1) if axis is None else X
    ax = 0 if axis is None else axis
    ordered = np.take_along_axis(flat, part, axis=ax)
    close(ordered, np.sort(flat, axis=ax))


def test_argsort_is_stable():
    x = np.array([3, 1, 3, 1, 2])
    close(knp.argsort(x), [1, 3, 4, 0, 2])


def test_searchsorted_digitize_isin():
    seq = np.array([0.0, 1.0, 1.0, 3.0])
    vals = np.array([[-1.0, 1.0], [2.0, 9.0]])
    for side in ("left", "right"):
        want = np.searchsorted(seq, vals, side=side)
        close(knp.searchsorted(seq, vals, side=side), want)
    close(knp.digitize(vals, seq), np.digitize(vals, seq))
    close(knp.digitize(vals, seq[::-1].copy()), np.digitize(vals, seq[::-1]))
    x = np.array([[1.0, np.nan], [3.0, -0.0]])
    table = np.array([0.0, 3.0, np.nan])
    close(knp.isin(x, table), np.isin(x, table))
    close(knp.isin(x, table, invert=True), np.isin(x, table, invert=True))
    with pytest.raises(ValueError, match="1-D"):
        knp.searchsorted(np.ones((2, 2)), vals)


# ---------------------------------------------------------------- products

MATMUL_SHAPES = [
    ((3, 4), (4, 5)),
    ((2, 3, 4), (4, 5)),
    ((4,), (2, 4, 5)),
    ((2, 3, 4), (4,)),
    ((4,), (4,)),
    ((3, 4), (2, 4, 5)),
    ((2, 1, 3, 4), (5, 4, 6)),
]


@pytest.mark.parametrize("s1,s2", MATMUL_SHAPES)
def test_matmul(s1, s2):
    a = RNG.standard_normal(s1).astype(np.float32)
    c = RNG.standard_normal(s2).astype(np.float32)
    close(knp.matmul(a, c), np.matmul(a, c), atol=1e-4)


def test_matmul_int8_gives_int32():
    a = np.full((2, 64), 100, np.int8)
    out = knp.matmul(a, a.T)
    assert out.dtype == np.int32
    close(out, np.full((2, 2), 640000))
    assert knp.matmul(a.astype(np.int16), a.T).dtype == np.int16


def test_matmul_shape_error_names_shapes():
    with pytest.raises(ValueError, match=r"\(3, 4\)"):
        knp.matmul(np.ones((3, 4)), np.ones((5, 2)))


@pytest.mark.parametrize(
    "s1,s2",
    [((), (3,)), ((3,), (3,)), ((2, 3), (3,)), ((2, 3), (3, 4)), ((2, 3, 4), (5, 4, 6))],
)
def test_dot(s1, s2):
    a = RNG.standard_normal(s1)
    c = RNG.standard_normal(s2)
    close(knp.dot(a, c), np.dot(a, c))


def test_tensordot_inner_outer_vdot_cross():
    a = RNG.standard_normal((2, 3, 4))
    c = RNG.standard_normal((3, 4, 5))
    close(knp.tensordot(a, c), np.tensordot(a, c))
    close(knp.tensordot(a, c[0], axes=1), np.tensordot(a, c[0], axes=1))
    axes = ([1, 2], [0, 1])
    close(knp.tensordot(a, c, axes=axes), np.tensordot(a, c, axes=axes))
    close(knp.tensordot(a, c, axes=0), np.tensordot(a, c, axes=0))
    close(knp.inner(a, c[0, :, :4].T), np.inner(a, c[0, :, :4].T))
    close(knp.outer(a, c), np.outer(a, c))
    z = a + 1j * a
    close(knp.vdot(z, z), np.vdot(z, z))
    u = RNG.standard_normal((4, 3))
    w = RNG.standard_normal((4, 3))
    close(knp.cross(u, w), np.cross(u, w))
    close(knp.cross(u[:, :2], w), np.cross(u[:, :2], w))
    close(knp.cross(u[:, :2], w[:, :2]), np.cross(u[:, :2], w[:, :2]))
    close(knp.cross(u.T, w.T, axis=0), np.cross(u.T, w.T, axis=0))
    close(knp.cross(u, w.T, axisb=0, axisc=0), np.cross(u, w.T, axisb=0, axisc=0))


EINSUMS = [
    ("ijk,lkj->il", [(2, 3, 4), (5, 4, 3)]),
    ("ij,jk", [(2, 3), (3, 4)]),
    ("ii->i", [(3, 3)]),
    ("ii", [(3, 3)]),
    ("iij->j", [(3, 3, 2)]),
    ("ij->", [(3, 4)]),
    ("ij->ji", [(3, 4)]),
    ("...ij,...jk->...ik", [(2, 3, 4), (4, 5)]),
    ("...i,...i", [(1, 3, 4), (2, 1, 4)]),
    ("i...->...", [(3, 2, 2)]),
    ("bij,bjk", [(2, 3, 4), (2, 4, 5)]),
    ("i,j", [(3,), (4,)]),
    ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 5)]),
    ("abc,cd,bd->a", [(2, 3, 4), (4, 5), (3, 5)]),
    ("ab,ab->", [(3, 4), (3, 4)]),
    ("ba,ca", [(3, 4), (5, 4)]),
    ("i,i,i->i", [(4,), (4,), (4,)]),
]


@pytest.mark.parametrize("spec,shapes", EINSUMS)
def test_einsum(spec, shapes):
    ops = [RNG.standard_normal(s) for s in shapes]
    close(knp.einsum(spec, *ops), np.einsum(spec, *ops), atol=1e-4)


def test_einsum_int8_gives_int32_and_errors():
    a = np.full((2, 64), 100, np.int8)
    out = knp.einsum("ij,kj->ik", a, a)
    assert out.dtype == np.int32
    close(out, np.full((2, 2), 640000))
    with pytest.raises(ValueError, match="operand"):
        knp.einsum("ij,jk->ik", np.ones((2, 2)))
    with pytest.raises(ValueError, match="sizes"):
        knp.einsum("ij,jk->ik", np.ones((2, 3)), np.ones((4, 2)))


# ------------------------------------------------------------ dtype rules

DTYPE_CASES = [
    ("sum", "int8", "int32"),
    ("sum", "uint8", "uint32"),
    ("sum", "bool", "int32"),
    ("sum", "float16", "float16"),
    ("prod", "int16", "int32"),
    ("mean", "int32", "float32"),
    ("mean", "bfloat16", "bfloat16"),
    ("var", "int8", "float32"),
    ("std", "float16", "float16"),
    ("median", "int32", "float32"),
    ("cumsum", "bool", "int32"),
    ("cumsum", "int8", "int8"),
    ("trace", "uint8", "uint32"),
    ("nansum", "int16", "int32"),
    ("max", "uint16", "uint16"),
    ("argsort", "float16", "int32"),
    ("count_nonzero", "float32", "int32"),
]


@pytest.mark.parametrize("name,dtype,want", DTYPE_CASES)
def test_result_dtypes(name, dtype, want):
    from keras_ipu.backend.dtype_utils import np_dtype

    x = np.ones((2, 2), np_dtype(dtype))
    assert getattr(knp, name)(x).dtype == np_dtype(want)


# ----------------------------------------------------- traced, unknown dims

TRACED = [
    ("sum", lambda x: knp.sum(x, axis=0), (4, 5)),
    ("mean kd", lambda x: knp.mean(x, axis=0, keepdims=True), (1, 4, 5)),
    ("var", lambda x: knp.var(x, axis=(0, 2)), (4,)),
    ("max initial", lambda x: knp.max(x, axis=0, initial=0.0), (4, 5)),
    ("argmax", lambda x: knp.argmax(x, axis=0), (4, 5)),
    ("median", lambda x: knp.median(x, axis=0), (4, 5)),
    ("quantile", lambda x: knp.quantile(x, np.array([0.1, 0.9]), axis=0), (2, 4, 5)),
    ("nanquantile", lambda x: knp.nanquantile(x, 0.3, axis=(0, 1)), (5,)),
    ("cumsum", lambda x: knp.cumsum(x, axis=0), (None, 4, 5)),
    ("diff", lambda x: knp.diff(x, axis=0), (None, 4, 5)),
    ("trace", lambda x: knp.trace(x, axis1=0, axis2=1), (5,)),
    ("argsort", lambda x: knp.argsort(x, axis=0), (None, 4, 5)),
    ("isin", lambda x: knp.isin(x, np.arange(3.0)), (None, 4, 5)),
    ("matmul", lambda x: knp.matmul(x, np.ones((5, 2), np.float32)), (None, 4, 2)),
    (
        "einsum diag",
        lambda x: knp.einsum("ii->i", knp.einsum("aib,ajb->ij", x, x)),
        (4,),
    ),
    ("histogram", lambda x: knp.histogram(knp.sum(x, axis=(1, 2)), bins=3)[0], (3,)),
]


@pytest.mark.parametrize("name,fn,want", TRACED, ids=[t[0] for t in TRACED])
def test_traced_with_unknown_dim(name, fn, want):
    spec = compute_output_spec(fn, KerasTensor((None, 4, 5), "float32"))
    assert tuple(spec.shape) == want


def test_traced_graph_records_primitives():
    builder = GraphBuilder()
    x = builder.new_input(ShapedArray((None, 3), np.float32))
    with tracing(builder):
        knp.quantile(x, 0.5, axis=0)
    names = {node.primitive.name for node in builder.graph.nodes}
    assert "sort" in names and "reduce_sum" in names


def test_bincount_traced_is_refused():
    with pytest.raises(NotImplementedError, match="static shapes"):
        compute_output_spec(knp.bincount, KerasTensor((None,), "int32"))


SPEC_OPS = [
    "sum", "prod", "mean", "max", "std", "var", "median", "nanmax", "nansum",
    "nanmean", "ptp", "cumsum", "trace", "sort", "argsort", "corrcoef",
]


@pytest.mark.parametrize("dtype", ["float64", "int64", "float16", "int8"])
@pytest.mark.parametrize("name", SPEC_OPS)
def test_eager_dtype_equals_symbolic_spec(name, dtype):
    """What runs and what Keras' symbolic spec promises must agree (Keras
    demotes most 64-bit results to 32 bits)."""
    from keras import ops

    fn = getattr(ops, name)
    shape = (2, 2)
    eager = fn(np.ones(shape, dtype))
    symbolic = fn(KerasTensor(shape, dtype))
    assert str(np.dtype(eager.dtype)) == symbolic.dtype


@pytest.mark.parametrize("dtype", ["float64", "int32"])
def test_percentile_dtype_follows_symbolic_spec(dtype):
    from keras import ops

    eager = ops.percentile(np.ones((3,), dtype), 50)
    symbolic = ops.percentile(KerasTensor((3,), dtype), 50)
    assert str(np.dtype(eager.dtype)) == symbolic.dtype


def test_bincount_compiled_with_minlength_has_a_static_length():
    from keras_ipu.device.jit import jit

    counts = jit(lambda x, w: knp.bincount(x, weights=w, minlength=6))
    x = np.array([0, 2, 2, 5, 1], "int32")
    w = np.array([1.0, 2.0, 3.0, 4.0, 5.0], "float32")
    close(counts(x, w), np.bincount(x, weights=w, minlength=6))
    # Rows (2-D values) and the unweighted form too.
    rows = jit(lambda x: knp.bincount(x, minlength=4))
    close(rows(np.array([[0, 3, 3], [1, 1, 2]], "int32")), [[1, 0, 0, 2], [0, 2, 1, 0]])
    with pytest.raises(ValueError, match=r"static length is minlength=6\), but the value 7"):
        counts(np.array([7, 1, 0, 0, 0], "int32"), w)


def test_bincount_compiled_weights_gradient():
    from keras_ipu.device.autodiff import grad

    x = np.array([0, 2, 2, 1], "int32")
    ct = np.array([10.0, 20.0, 30.0], "float32")

    def loss(w):
        return knp.sum(knp.bincount(x, weights=w, minlength=3) * ct)

    from keras_ipu.device.jit import jit

    g = jit(grad(loss))(np.ones(4, "float32"))
    close(g, ct[x])
