"""Compile-time specialised kernels agree with the primitives' eager kernels."""

import numpy as np
import pytest

from keras_ipu.device.compiler import compile_graph
from keras_ipu.device.compiler.lowering import lower
from keras_ipu.device.ir import ShapedArray
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


@pytest.mark.parametrize("name", ["reduce_sum", "reduce_prod", "reduce_max", "reduce_min"])
@pytest.mark.parametrize("dtype", ["float32", "int32", "bool", "float16"])
@pytest.mark.parametrize("axes", [(0,), (1, 2), (0, 1, 2)])
def test_reductions(name, dtype, axes):
    x = (rng.standard_normal((3, 4, 2)) * 2).astype(dtype)
    _check(name, [x], axes=axes)


def test_reshape():
    _check("reshape", [np.arange(12.0).reshape(3, 4)], new_shape=(2, -1))


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
