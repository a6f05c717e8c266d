"""Compile-time specialised kernels agree with the primitives' eager kernels."""

import numpy as np
import pytest

from keras_ipu.device.compiler import compile_graph
from keras_ipu.device.compiler.lowering import lower
from keras_ipu.device.ir import ShapedArray
from keras_ipu.device.native import product_pool
from keras_ipu.device.primitives import REGISTRY
from keras_ipu.device.trace import trace_flat


def _check(name, operands, **params):
    prim = REGISTRY[name]
    in_avals = [ShapedArray(x.shape, x.dtype) for x in operands]
    out = prim.abstract_eval(*in_avals, **params)
    out_avals = out if prim.multiple_results else (out,)
    got = lower(prim, params, in_avals, out_avals)(*operands)
    want = np.asarray(prim.kernel(*operands, **params))
    assert type(got) is np.ndarray
    assert got.shape == want.shape == out_avals[0].shape
    assert got.dtype == want.dtype == out_avals[0].dtype
    np.testing.assert_array_equal(got, want)


rng = np.random.default_rng(0)


@pytest.mark.parametrize(
    "lhs_shape, rhs_shape, dims, dtype, preferred",
    [
        ((3, 4), (4, 5), (((1,), (0,)), ((), ())), "float32", None),
        ((4, 3), (5, 4), (((0,), (1,)), ((), ())), "float32", None),  # transposed
        ((4, 3), (4, 5), (((0,), (0,)), ((), ())), "float32", None),  # x^T @ g
        ((3, 4), (5, 4), (((1,), (1,)), ((), ())), "float32", None),  # g @ w^T
        ((2, 4, 3), (2, 5, 4), (((1,), (2,)), ((0,), (0,))), "float32", None),
        ((2, 3, 4), (2, 4, 5), (((2,), (1,)), ((0,), (0,))), "float32", None),
        ((3, 2, 4), (4, 5, 2), (((2,), (0,)), ((1,), (2,))), "float64", None),
        ((3, 4), (4,), (((1,), (0,)), ((), ())), "float16", None),
        ((3, 4), (4, 2), (((1,), (0,)), ((), ())), "int8", np.dtype("int32")),
        ((4,), (4,), (((0,), (0,)), ((), ())), "float32", None),  # 0-d result
    ],
)
def test_dot_general(lhs_shape, rhs_shape, dims, dtype, preferred):
    lhs = (rng.standard_normal(lhs_shape) * 3).astype(dtype)
    rhs = (rng.standard_normal(rhs_shape) * 3).astype(dtype)
    _check("dot_general", [lhs, rhs], dimension_numbers=dims,
           preferred_element_type=preferred)


@pytest.mark.parametrize("lhs_shape, rhs_shape, dims, plain", [
    ((3, 4), (4, 5), (((1,), (0,)), ((), ())), True),
    ((4, 3), (4, 5), (((0,), (0,)), ((), ())), True),
    ((3, 4), (5, 4), (((1,), (1,)), ((), ())), True),
    ((4, 3), (5, 4), (((0,), (1,)), ((), ())), True),
    ((2, 4, 3), (2, 5, 4), (((1,), (2,)), ((0,), (0,))), True),
    ((3, 2, 4), (4, 5, 2), (((2,), (0,)), ((1,), (2,))), True),  # batch axes moved: views
    ((3, 2, 4), (4, 5), (((2,), (0,)), ((), ())), False),  # x reshaped to (6, 4)
    ((3, 4), (4,), (((1,), (0,)), ((), ())), False),  # y reshaped to (4, 1)
])
def test_products_in_matmul_layout_need_no_reshape(lhs_shape, rhs_shape, dims, plain):
    """A product whose operands (transposed) and result have the matmul's
    shapes runs as a transpose view and one matmul (dot_lowering's
    _plain_product); the same values as the eager kernel either way."""
    lhs, rhs = (rng.standard_normal(s).astype("float32") for s in (lhs_shape, rhs_shape))
    in_avals = [ShapedArray(x.shape, x.dtype) for x in (lhs, rhs)]
    prim = REGISTRY["dot_general"]
    params = {"dimension_numbers": dims}
    kernel = lower(prim, params, in_avals, (prim.abstract_eval(*in_avals, **params),))
    assert kernel.__qualname__.startswith("_plain_product.") == plain
    assert np.array_equal(kernel(lhs, rhs), prim.kernel(lhs, rhs, **params))


def test_column_major_operand_is_copied_in_its_own_order():
    """A product contracting a time-major view of a (batch, time, features)
    array over time and batch (an LSTM's embedding-kernel gradient): the
    lhs matrix is a copy in the view's memory order read transposed, not a
    row-major gather; an evenly laid out operand stays a view; the bits
    are the whole product's (product_pool.matmul) of the row-major copy."""
    from keras_ipu.device.compiler.dot_lowering import _matrix

    g = rng.standard_normal((128, 32, 64)).astype("float32")
    x = g.transpose(1, 0, 2)  # (time, batch, features)
    dz = rng.standard_normal((32, 128, 512)).astype("float32")
    lhs = x.transpose(2, 0, 1)  # the kernel's transpose: features, then the contracted axes
    matrix = _matrix(lhs, 1, (64, 4096))
    assert matrix.shape == (64, 4096) and matrix.T.flags.c_contiguous
    assert not np.shares_memory(matrix, g)
    stacked = np.ascontiguousarray(x)
    view = _matrix(stacked.transpose(2, 0, 1), 1, (64, 4096))
    assert np.shares_memory(view, stacked)
    params = {"dimension_numbers": (((0, 1), (0, 1)), ((), ()))}
    prim = REGISTRY["dot_general"]
    in_avals = [ShapedArray(a.shape, a.dtype) for a in (x, dz)]
    kernel = lower(prim, params, in_avals, (prim.abstract_eval(*in_avals, **params),))
    want = product_pool.matmul(lhs.reshape(64, 4096), dz.reshape(4096, 512))
    assert np.array_equal(kernel(x, dz), want)
    # Below OpenBLAS' small-matrix bound (other kernels per layout) nothing changes.
    small = g[:8, :4, :16].transpose(1, 0, 2)
    in_avals = [ShapedArray(small.shape, small.dtype), ShapedArray((4, 8, 8), "float32")]
    kernel = lower(prim, params, in_avals, (prim.abstract_eval(*in_avals, **params),))
    grad = rng.standard_normal((4, 8, 8)).astype("float32")
    assert np.array_equal(kernel(small, grad),
                          product_pool.matmul(small.transpose(2, 0, 1).reshape(16, 32),
                                              grad.reshape(32, 8)))


@pytest.mark.parametrize("name", ["reduce_sum", "reduce_prod", "reduce_max", "reduce_min"])
@pytest.mark.parametrize("dtype", ["float32", "int32", "bool", "float16"])
@pytest.mark.parametrize("axes", [(0,), (1, 2), (0, 1, 2)])
def test_reductions(name, dtype, axes):
    x = (rng.standard_normal((3, 4, 2)) * 2).astype(dtype)
    _check(name, [x], axes=axes)


def test_reshape():
    _check("reshape", [np.arange(12.0).reshape(3, 4)], new_shape=(2, -1))


@pytest.mark.parametrize("shape, start, limit, strides", [
    ((128, 512), (None, 128), (None, 256), (1, 1)),  # an LSTM's gate: a view
    ((5, 6, 7), (1, -4, 0), (None, 6, 7), (2, 1, 3)),
    ((), (), (), ()),
])
def test_slice_lowering_is_the_kernels_view(shape, start, limit, strides):
    x = rng.standard_normal(shape).astype(np.float32)
    params = dict(start_indices=start, limit_indices=limit, strides=strides)
    _check("slice", [x], **params)
    if shape:
        aval = ShapedArray(shape, x.dtype)
        out = REGISTRY["slice"].abstract_eval(aval, **params)
        assert np.shares_memory(lower(REGISTRY["slice"], params, [aval], (out,))(x), x)


@pytest.mark.parametrize("name", ["add", "max", "div", "exp", "pow"])
def test_ufunc_lowering_matches_kernel_including_0d(name):
    prim = REGISTRY[name]
    n = 2 if name in ("add", "max", "div", "pow") else 1
    for shape in [(3, 2), ()]:
        xs = [np.asarray(rng.random(shape) + 0.5, np.float32) for _ in range(n)]
        _check(name, xs)


def test_compiled_program_uses_the_specialised_kernels():
    def fn(x, w):
        out = REGISTRY["dot_general"].bind(
            x, w, dimension_numbers=(((1,), (0,)), ((), ())),
            preferred_element_type=None,
        )
        return [REGISTRY["reduce_sum"].bind(out, axes=(0, 1))]

    graph, _ = trace_flat(fn, [ShapedArray((2, 3), "float32"), ShapedArray((3, 4), "float32")])
    exe = compile_graph(graph)
    names = [kernel.__name__ for kernel, *_ in exe._program]
    assert names == ["dot_general", "reduce_to_scalar"]
    x = rng.standard_normal((2, 3)).astype("float32")
    w = rng.standard_normal((3, 4)).astype("float32")
    np.testing.assert_allclose(exe.run(x, w)[0], (x @ w).sum(), rtol=1e-5)


# -- fast paths: comparisons, integer/bit ufuncs, select, convert -----------

from keras_ipu.device.compiler import host_memory  # noqa: E402
from keras_ipu.device.compiler.lowering import select_kernel  # noqa: E402


@pytest.mark.parametrize("name", ["eq", "ne", "lt", "le", "gt", "ge"])
@pytest.mark.parametrize("dtype", ["float32", "int32", "bool"])
def test_comparison_lowering_matches_kernel(name, dtype):
    for shape in [(3, 4), ()]:
        a = (rng.standard_normal(shape) * 2).round().astype(dtype)
        b = (rng.standard_normal(shape) * 2).round().astype(dtype)
        _check(name, [a, b])


@pytest.mark.parametrize("name", ["add", "sub", "mul", "max", "min", "neg",
                                  "and", "or", "xor", "not"])
@pytest.mark.parametrize("dtype", ["int32", "uint8", "bool"])
def test_integer_and_bit_lowering_matches_kernel(name, dtype):
    if dtype == "bool" and name not in ("and", "or", "xor", "not", "max", "min"):
        return  # bool arithmetic keeps the kernel (its uint8 detour)
    if name in ("and", "or", "xor", "not") and dtype == "float32":
        return
    n = 1 if name in ("neg", "not") else 2
    big = np.iinfo(np.int32).max if dtype == "int32" else 1
    xs = [np.asarray(rng.integers(0, 3, (4, 2)) * big).astype(dtype) for _ in range(n)]
    _check(name, xs)  # int32 overflow wraps as in the kernel


@pytest.mark.parametrize("src, dst", [
    ("int32", "float32"), ("bool", "float32"), ("float32", "float16"),
    ("float16", "float32"), ("float32", "float32"), ("int32", "int8"),
    ("float32", "int32"), ("float32", "bool"),
])
@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # run() silences them
def test_convert_lowering_matches_kernel(src, dst):
    x = (rng.standard_normal((5, 3)) * 300).astype(src)
    if src == "float32":
        x[0, :3] = [np.nan, np.inf, -3e10]
    _check("convert_element_type", [x], dtype=np.dtype(dst))


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "int32", "bool", "int8"])
@pytest.mark.parametrize("shapes", [
    ((128, 64), (128, 64), (128, 64)),
    ((128, 64), (), ()),  # a ReLU gradient's 0/1 mask
    ((128, 1), (128, 64), ()),
    ((1, 64), (128, 1), (128, 64)),
    ((64, 1), (1, 128), ()),  # only the result has the full shape
])
def test_select_is_bit_exact_with_where(dtype, shapes):
    p_shape, t_shape, f_shape = shapes
    pred = rng.random(p_shape) > 0.5
    on_true = (rng.standard_normal(t_shape) * 4).astype(dtype)
    on_false = (rng.standard_normal(f_shape) * 4).astype(dtype)
    if np.dtype(dtype).kind == "f" and on_true.ndim:
        on_true.flat[:3] = [np.nan, -0.0, -np.inf]
    out = ShapedArray(np.broadcast_shapes(*shapes), dtype)
    kernel = select_kernel(
        [ShapedArray(p_shape, "bool"), ShapedArray(t_shape, dtype),
         ShapedArray(f_shape, dtype)], out)
    assert kernel is not np.where  # large enough for the bitwise select
    got = kernel(np.asarray(pred), np.asarray(on_true), np.asarray(on_false))
    want = np.where(pred, on_true, on_false)
    assert got.shape == want.shape and got.dtype == want.dtype
    assert got.tobytes() == want.tobytes()  # NaN payloads and -0.0 too
    _check("select", [np.asarray(pred), np.asarray(on_true), np.asarray(on_false)])


def test_small_select_keeps_where():
    avals = [ShapedArray((3,), "bool"), ShapedArray((3,), "float32"),
             ShapedArray((3,), "float32")]
    assert select_kernel(avals, ShapedArray((3,), "float32")) is np.where


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_logistic_kernel_values(dtype):
    x = (rng.standard_normal(4096) * 20).astype(dtype)
    x[:7] = [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-30, -1e-30]
    e = np.exp(-np.abs(x))
    want = np.where(x >= 0, 1 / (1 + e), e / (1 + e))  # the stable formula
    got = np.asarray(REGISTRY["logistic"].kernel(x))
    assert got.dtype == x.dtype
    np.testing.assert_array_equal(got, want)
    scalar = np.asarray(REGISTRY["logistic"].kernel(x[8]))
    assert scalar.shape == () and scalar.dtype == x.dtype
    np.testing.assert_array_equal(scalar, want[8])


def test_malloc_tuning_can_be_turned_off(monkeypatch):
    monkeypatch.setattr(host_memory, "_applied", None)
    monkeypatch.setenv("KERAS_IPU_HOST_MALLOC", "0")
    assert host_memory.tune_malloc() is False
    monkeypatch.setattr(host_memory, "_applied", None)
    monkeypatch.delenv("KERAS_IPU_HOST_MALLOC")
    assert host_memory.tune_malloc() in (True, False)  # False off glibc


@pytest.mark.parametrize("name", ["logistic", "rsqrt"])
@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_raw_float_kernels_match_the_checked_kernel(name, dtype):
    for shape in [(64, 3), ()]:
        x = rng.standard_normal(shape) * 5
        x = np.asarray(np.abs(x) + 0.1 if name == "rsqrt" else x, dtype)
        _check(name, [x])


@pytest.mark.parametrize("operand_shape, index_shape, dtype", [
    ((50, 8), (30, 7), "float32"),   # an embedding gradient: many duplicates
    ((6,), (40,), "float64"),        # scalar rows
    ((5, 2, 3), (9,), "float16"),
    ((4, 3), (0,), "float32"),       # no updates at all
])
@pytest.mark.parametrize("zero_operand", [True, False])
def test_row_scatter_add_is_bit_exact(operand_shape, index_shape, dtype, zero_operand):
    n = operand_shape[0]
    x = (np.zeros(operand_shape) if zero_operand
         else rng.standard_normal(operand_shape)).astype(dtype)
    # Negative indices wrap; out-of-range ones are dropped.
    idx = rng.integers(-n - 2, n + 2, index_shape + (1,)).astype(np.int32)
    upd = rng.standard_normal(index_shape + operand_shape[1:]).astype(dtype)
    _check("scatter", [x, idx, upd], mode="add", batch_dims=0)


def test_other_scatters_keep_the_kernel():
    x = rng.standard_normal((5, 2)).astype("float32")
    idx = np.array([[1], [1], [3]], np.int32)
    upd = rng.standard_normal((3, 2)).astype("float32")
    for mode in ("update", "max", "mul"):
        _check("scatter", [x, idx, upd], mode=mode, batch_dims=0)
    _check("scatter", [x.astype("int32"), idx, upd.astype("int32")], mode="add", batch_dims=0)
