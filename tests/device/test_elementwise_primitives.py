"""Elementwise and special primitives: shape rule == kernel, values.

Every primitive registered by elementwise.py and special.py is swept over
the dtypes it accepts: the (shape, dtype) its shape rule announces must be
exactly what its kernel returns, and a traced call with an unknown (None)
dimension must give the expected ShapedArray.
"""

import ml_dtypes
import numpy as np
import pytest

from keras_ipu.device.ir import ShapedArray
from keras_ipu.device.primitives import elementwise as ew
from keras_ipu.device.primitives import special
from keras_ipu.device.primitives.convert import bitcast_convert_type_p
from keras_ipu.device.primitives.convert import convert_element_type_p
from keras_ipu.device.primitives.registry import Primitive
from keras_ipu.device.trace import GraphBuilder

F32, F16, I32, BOOL = (np.dtype(d) for d in ("float32", "float16", "int32", "bool"))
BF16 = np.dtype(ml_dtypes.bfloat16)
C64 = np.dtype("complex64")

TERNARY = {"select", "clamp", "betainc"}
BINARY = {
    "add", "sub", "mul", "div", "floor_div", "rem", "mod", "pow", "max",
    "min", "atan2", "hypot", "copysign", "nextafter", "logaddexp",
    "logaddexp2", "and", "or", "xor", "shift_left", "shift_right", "gcd",
    "lcm", "eq", "ne", "lt", "le", "gt", "ge", "igamma", "igammac",
}  # fmt: skip
# Integer-only kernels, and those that also take bool.
INT_ONLY = {"shift_left", "shift_right", "gcd", "lcm", "population_count"}
INT_OR_BOOL = {"and", "or", "xor", "not"}
# Float-only kernels (transcendental, rounding, special functions).
FLOAT_ONLY = {
    "floor", "ceil", "round", "trunc", "exp", "exp2", "expm1", "log",
    "log1p", "log2", "log10", "sqrt", "rsqrt", "cbrt", "reciprocal", "sin",
    "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "tanh", "asinh",
    "acosh", "atanh", "logistic", "atan2", "hypot", "copysign", "nextafter",
    "logaddexp", "logaddexp2", "div", "angle", "erf", "erfc", "erfinv",
    "lgamma", "digamma", "i0", "i0e", "i1", "i1e", "igamma", "igammac",
    "betainc",
}  # fmt: skip
# Kernels NumPy has no bool loop for, and the device does not offer either.
NO_BOOL = {"neg", "sub", "floor_div", "rem", "mod", "pow", "sign", "abs", "square"}


def _prims(module):
    return {
        v.name: v
        for v in vars(module).values()
        if isinstance(v, Primitive) and v.name in _registered_by(module)
    }


def _registered_by(module):
    names = set()
    for k, v in vars(module).items():
        if isinstance(v, Primitive) and k.endswith("_p"):
            names.add(v.name)
    return names


ELEMENTWISE = {**_prims(ew), **_prims(special)}


def _arity(name):
    if name in TERNARY:
        return 3
    return 2 if name in BINARY else 1


def _dtypes_for(name):
    if name in INT_ONLY:
        return [I32]
    if name in INT_OR_BOOL:
        return [I32, BOOL]
    if name in FLOAT_ONLY:
        return [F32, F16, BF16]
    out = [F32, F16, BF16, I32]
    if name not in NO_BOOL:
        out.append(BOOL)
    return out


def _operands(name, dtype, shapes):
    rng = np.random.default_rng(0)
    out = []
    for i, shape in enumerate(shapes):
        if name == "select" and i == 0:
            out.append(rng.random(shape) > 0.5)
            continue
        if dtype == BOOL:
            out.append(rng.random(shape) > 0.5)
        elif dtype.kind in "iu":
            out.append(rng.integers(1, 7, shape).astype(dtype))
        else:
            # In (0.1, 0.9): inside the domain of every float kernel here.
            out.append((0.1 + 0.8 * rng.random(shape)).astype(dtype))
    return out


CASES = [
    pytest.param(name, dtype, id=f"{name}-{dtype.name}")
    for name in sorted(ELEMENTWISE)
    for dtype in _dtypes_for(name)
]


def test_sweep_covers_every_primitive():
    assert {"add", "select", "clamp", "erf", "i0", "nextafter"} <= set(ELEMENTWISE)
    assert len(CASES) >= 2 * len(ELEMENTWISE)


@pytest.mark.parametrize("name,dtype", CASES)
def test_shape_rule_matches_kernel(name, dtype):
    prim = ELEMENTWISE[name]
    shapes = [(2, 3), (1, 3), (2, 1)][: _arity(name)]
    args = _operands(name, dtype, shapes)
    out = prim.bind(*args)
    aval = prim.abstract_eval(*(ShapedArray(a.shape, a.dtype) for a in args))
    assert out.shape == aval.shape == (2, 3)
    assert out.dtype == aval.dtype


@pytest.mark.parametrize("name,dtype", CASES)
def test_traced_call_keeps_unknown_dim(name, dtype):
    prim = ELEMENTWISE[name]
    n = _arity(name)
    builder = GraphBuilder()
    in_dtypes = [BOOL if (name == "select" and i == 0) else dtype for i in range(n)]
    tracers = [builder.new_input(ShapedArray((None, 3), d)) for d in in_dtypes]
    # One operand broadcasts: the unknown dim must survive broadcasting.
    if n > 1:
        tracers[-1] = builder.new_input(ShapedArray((1, 3), in_dtypes[-1]))
    out = prim.bind(*tracers)
    concrete = prim.bind(*_operands(name, dtype, [(4, 3)] * n))
    assert out.aval == ShapedArray((None, 3), concrete.dtype)
    assert builder.graph.nodes[-1].primitive is prim


@pytest.mark.parametrize("dtype", [F32, F16, BF16])
def test_low_precision_keeps_dtype(dtype):
    x = np.array([0.25, 0.5, 2.0], dtype=dtype)
    for prim in (ew.exp_p, ew.sqrt_p, ew.tanh_p, special.erf_p, special.i0_p):
        out = prim.bind(x)
        assert out.dtype == dtype, prim
        ref = getattr(np, {"erf": "exp", "i0": "exp"}.get(prim.name, prim.name))
        if prim.name in ("exp", "sqrt", "tanh"):
            np.testing.assert_allclose(
                np.asarray(out, np.float32), ref(x.astype(np.float32)), rtol=1e-2
            )


def test_complex_kernels():
    z = np.array([3 + 4j, -1 - 1j], dtype=C64)
    assert ew.abs_p.bind(z).dtype == F32
    np.testing.assert_allclose(ew.abs_p.bind(z), [5.0, np.sqrt(2)], rtol=1e-6)
    np.testing.assert_allclose(ew.real_p.bind(z), [3, -1])
    np.testing.assert_allclose(ew.imag_p.bind(z), [4, -1])
    np.testing.assert_allclose(ew.angle_p.bind(z), np.angle(z), rtol=1e-6)
    assert ew.angle_p.bind(z).dtype == F32
    np.testing.assert_allclose(ew.conj_p.bind(z), [3 - 4j, -1 + 1j])
    np.testing.assert_allclose(ew.exp_p.bind(z), np.exp(z), rtol=1e-6)
    assert ew.exp_p.bind(z).dtype == C64
    traced = GraphBuilder().new_input(ShapedArray((None,), C64))
    assert ew.abs_p.bind(traced).aval == ShapedArray((None,), F32)


def test_angle_of_real_keeps_float32():
    # np.angle computes float32 input in float64; the kernel must not.
    out = ew.angle_p.bind(np.array([-1.0, 2.0], F32))
    assert out.dtype == F32
    np.testing.assert_allclose(out, [np.pi, 0.0], rtol=1e-6)


def test_integer_power_with_negative_exponent():
    x = np.array([2, 1, -1, -1, 0, 3], I32)
    y = np.array([-1, -5, -3, -2, 2, 3], I32)
    np.testing.assert_array_equal(ew.pow_p.bind(x, y), [0, 1, -1, 1, 0, 27])


def test_shifts_by_the_width_or_more():
    x = np.array([1, -128, 64, -1], np.int8)
    np.testing.assert_array_equal(
        ew.shift_left_p.bind(x, np.array([7, 1, 8, 9], np.int8)), [-128, 0, 0, 0]
    )
    np.testing.assert_array_equal(
        ew.shift_right_p.bind(x, np.array([9, 8, 1, 100], np.int8)), [0, -1, 32, -1]
    )
    u = np.array([255], np.uint8)
    np.testing.assert_array_equal(ew.shift_right_p.bind(u, np.array([8], np.uint8)), [0])


def test_mod_and_rem_signs():
    x = np.array([-7.0, 7.0], F32)
    y = np.array([3.0, -3.0], F32)
    np.testing.assert_array_equal(ew.mod_p.bind(x, y), [2.0, -2.0])
    np.testing.assert_array_equal(ew.rem_p.bind(x, y), [-1.0, 1.0])
    xi, yi = x.astype(I32), y.astype(I32)
    np.testing.assert_array_equal(ew.mod_p.bind(xi, yi), [2, -2])
    np.testing.assert_array_equal(ew.floor_div_p.bind(xi, yi), [-3, -3])


def test_round_half_to_even_and_logistic_tails():
    x = np.array([0.5, 1.5, 2.5, -0.5], F32)
    np.testing.assert_array_equal(ew.round_p.bind(x), [0.0, 2.0, 2.0, -0.0])
    t = np.array([-30.0, 0.0, 100.0], F32)
    np.testing.assert_allclose(ew.logistic_p.bind(t), [1 / (1 + np.exp(30.0)), 0.5, 1.0], rtol=1e-6)


def test_bool_arithmetic_stays_bool():
    a = np.array([True, True, False])
    b = np.array([True, False, False])
    np.testing.assert_array_equal(ew.add_p.bind(a, b), [True, True, False])
    np.testing.assert_array_equal(ew.mul_p.bind(a, b), [True, False, False])
    np.testing.assert_array_equal(ew.max_p.bind(a, b), [True, True, False])


def test_select_and_clamp_values():
    p = np.array([True, False, True])
    on = np.array([1.0, 2.0, 3.0], F32)
    off = np.array([9.0], F32)
    np.testing.assert_array_equal(ew.select_p.bind(p, on, off), [1.0, 9.0, 3.0])
    with pytest.raises(TypeError, match="predicate must be bool"):
        ew.select_p.bind(on, on, on)
    x = np.array([-5, 0, 5], I32)
    np.testing.assert_array_equal(
        ew.clamp_p.bind(np.int32(-1), x, np.int32(2)), [-1, 0, 2]
    )


def test_operand_dtypes_must_match():
    with pytest.raises(TypeError, match="share one dtype"):
        ew.add_p.bind(np.ones(2, F32), np.ones(2, I32))


def test_special_values():
    from scipy import special as sp

    x = np.array([0.1, 0.7, 2.0], F32)
    for prim, ref in [
        (special.erf_p, sp.erf),
        (special.erfc_p, sp.erfc),
        (special.lgamma_p, sp.gammaln),
        (special.digamma_p, sp.digamma),
        (special.i0_p, sp.i0),
        (special.i1e_p, sp.i1e),
    ]:
        np.testing.assert_allclose(prim.bind(x), ref(x.astype(np.float64)), rtol=1e-5)
    np.testing.assert_allclose(
        special.igamma_p.bind(x, x), sp.gammainc(x, x), rtol=1e-5
    )


def test_float_to_int_conversion_saturates():
    x = np.array([3e9, -3e9, np.nan, -2.7, 2.7], F32)
    out = convert_element_type_p.bind(x, dtype=I32)
    np.testing.assert_array_equal(out, [2**31 - 1, -(2**31), 0, -2, 2])
    z = np.array([1 + 2j], C64)
    np.testing.assert_array_equal(convert_element_type_p.bind(z, dtype=F32), [1.0])


@pytest.mark.parametrize("target", ["int8", "uint8", "int16", "int32", "uint32", "int64"])
@pytest.mark.parametrize("source", ["float16", "float32", "float64"])
def test_float_to_int_in_range_fast_path_agrees_with_saturating_rule(source, target):
    # In-range values take a plain cast; a bound a float rounds onto (2**31
    # in float32 is above int32's max) and NaN must still saturate / zero.
    info = np.iinfo(target)
    with np.errstate(all="ignore"):
        values = np.array(
            [2.9, -2.9, 0.0, -0.0, 2**31, -(2**31), 2**31 - 128, 255.5, 256, -129,
             127.9, np.nan, np.inf, -np.inf, 1e20],
            source,
        )
    for x in [values] + [values[i : i + 1] for i in range(values.size)]:
        got = convert_element_type_p.bind(x, dtype=np.dtype(target))
        with np.errstate(all="ignore"):
            wide = np.nan_to_num(np.trunc(x.astype(np.float64)), nan=0.0)
            want = np.clip(wide, info.min, info.max).astype(target)
        np.testing.assert_array_equal(got, want)


def test_view_mode_of_bitcast():
    x = np.arange(16, dtype=F32).reshape(2, 8)
    out = bitcast_convert_type_p.bind(x, dtype=np.dtype("int16"), view=True)
    np.testing.assert_array_equal(out, x.view(np.int16))
    out = bitcast_convert_type_p.bind(x, dtype=np.dtype("float64"), view=True)
    np.testing.assert_array_equal(out, x.view(np.float64))
    tracer = GraphBuilder().new_input(ShapedArray((None, 8), F32))
    out = bitcast_convert_type_p.bind(tracer, dtype=np.dtype("uint8"), view=True)
    assert out.aval == ShapedArray((None, 32), np.uint8)
    with pytest.raises(ValueError, match="not a multiple"):
        bitcast_convert_type_p.bind(np.ones(3, F32), dtype=np.dtype("float64"), view=True)
    # Default (lax) mode: a size change adds a last axis.
    out = bitcast_convert_type_p.bind(np.ones(3, F32), dtype=np.dtype("int16"))
    assert out.shape == (3, 2)
