"""Elementwise ops of the ipu backend (keras_ipu/backend/numpy/elementwise.py).

Values are checked against NumPy; result dtypes against hand-written Keras
(JAX) promotion results and against what the same op gives under tracing
(keras.ops on a symbolic KerasTensor with a None dimension).
"""

import os

os.environ.setdefault("KERAS_BACKEND", "ipu")

import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

import keras  # noqa: E402
from keras import ops  # noqa: E402
from keras.src.backend.common import standardize_dtype  # noqa: E402

from keras_ipu.backend.core import convert_to_tensor  # noqa: E402
from keras_ipu.backend.numpy import elementwise as E  # noqa: E402

pytestmark = pytest.mark.skipif(
    keras.backend.backend() != "ipu", reason="needs KERAS_BACKEND=ipu"
)

DTYPES = [
    "bool", "int8", "int16", "int32", "uint8", "uint16", "uint32",
    "bfloat16", "float16", "float32",
]  # fmt: skip


def _ones(shape, dtype):
    if dtype == "bfloat16":
        return convert_to_tensor(np.ones(shape, ml_dtypes.bfloat16))
    return convert_to_tensor(np.ones(shape, dtype))


def _dt(x):
    return standardize_dtype(x.dtype)


UNARY = [
    "abs", "absolute", "angle", "arccos", "arccosh", "arcsin", "arcsinh",
    "arctan", "arctanh", "bitwise_invert", "bitwise_not", "cbrt", "ceil",
    "conj", "conjugate", "cos", "cosh", "deg2rad", "exp", "exp2", "expm1",
    "fabs", "floor", "i0", "imag", "isfinite", "isinf", "isnan", "isneginf",
    "isposinf", "isreal", "log", "log10", "log1p", "log2", "logical_not",
    "nan_to_num", "negative", "rad2deg", "real", "reciprocal", "round",
    "sign", "signbit", "sin", "sinc", "sinh", "sqrt", "square", "tan",
    "tanh", "trunc",
]  # fmt: skip
BINARY = [
    "add", "arctan2", "bitwise_and", "bitwise_left_shift", "bitwise_or",
    "bitwise_right_shift", "bitwise_xor", "divide", "divide_no_nan",
    "equal", "floor_divide", "fmax", "fmin", "fmod", "gcd", "greater",
    "greater_equal", "heaviside", "hypot", "isclose", "lcm", "left_shift",
    "less", "less_equal", "logaddexp", "logaddexp2", "logical_and",
    "logical_or", "logical_xor", "maximum", "minimum", "mod", "multiply",
    "nextafter", "not_equal", "power", "right_shift", "subtract",
    "true_divide",
]  # fmt: skip


def test_all_lists_every_op():
    assert set(UNARY) | set(BINARY) <= set(E.__all__)
    for name in E.__all__:
        assert callable(getattr(E, name)), name
    # Keras finds them through the backend's numpy namespace.
    from keras_ipu.backend import numpy as knp

    for name in E.__all__:
        assert getattr(knp, name) is not None


def _valid(name, dtype):
    if name in ("negative", "sign", "round") and dtype == "bool":
        return False
    if name.startswith("bitwise") or name in ("gcd", "lcm", "left_shift", "right_shift"):
        return "float" not in dtype
    if name == "subtract" and dtype == "bool":
        return False
    return True


# Keras' own output specs that do not follow the op's dtype rule: Reciprocal
# always says floatx.
SPEC_DIFFERS = {"reciprocal"}
# Keras' bitwise specs use x's shape without broadcasting.
SPEC_NO_BROADCAST = {
    "bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_left_shift",
    "bitwise_right_shift", "left_shift", "right_shift",
}  # fmt: skip


@pytest.mark.parametrize("name", [n for n in UNARY if n not in SPEC_DIFFERS])
def test_unary_eager_dtype_equals_symbolic(name):
    for dtype in DTYPES:
        if not _valid(name, dtype):
            continue
        eager = getattr(ops, name)(_ones((2, 3), dtype))
        symbolic = getattr(ops, name)(keras.KerasTensor((None, 3), dtype=dtype))
        assert _dt(eager) == symbolic.dtype, (name, dtype)
        assert eager.shape == (2, 3)
        assert symbolic.shape == (None, 3)


@pytest.mark.parametrize("name", BINARY)
def test_binary_eager_dtype_equals_symbolic(name):
    for d1 in DTYPES:
        for d2 in DTYPES:
            if d1 == d2 == "bool" or not (_valid(name, d1) and _valid(name, d2)):
                continue
            if name == "ldexp":
                continue
            eager = getattr(ops, name)(_ones((2, 1), d1), _ones((1, 3), d2))
            symbolic = getattr(ops, name)(
                keras.KerasTensor((None, 1), dtype=d1),
                keras.KerasTensor((1, 3), dtype=d2),
            )
            assert _dt(eager) == symbolic.dtype, (name, d1, d2)
            assert eager.shape == (2, 3)
            if name not in SPEC_NO_BROADCAST:
                assert symbolic.shape == (None, 3)


# Keras (= JAX with x64 off) result dtypes, written out by hand.
EXPECTED = [
    ("sqrt", ("int8",), "float32"),
    ("sqrt", ("float16",), "float16"),
    ("sqrt", ("bfloat16",), "bfloat16"),
    ("exp", ("bool",), "float32"),
    ("add", ("int8", "uint8"), "int16"),
    ("add", ("bool", "int8"), "int8"),
    ("add", ("bfloat16", "float16"), "float32"),
    ("add", ("uint32", "int32"), "int32"),
    ("multiply", ("bool", "bool"), "bool"),
    ("divide", ("int32", "int32"), "float32"),
    ("divide", ("int8", "float16"), "float16"),
    ("floor_divide", ("int8", "uint8"), "int16"),
    ("mod", ("bool", "bool"), "int32"),
    ("fmod", ("bool", "bool"), "int32"),
    ("square", ("bool",), "int32"),
    ("fabs", ("int8",), "float32"),
    ("fabs", ("float16",), "float16"),
    ("absolute", ("int8",), "int8"),
    ("isnan", ("int32",), "bool"),
    ("ceil", ("int32",), "float32"),
    ("trunc", ("int32",), "int32"),
    ("round", ("int16",), "int16"),
    ("cbrt", ("uint8",), "float32"),
    ("i0", ("float16",), "float16"),
    ("i0", ("int32",), "float32"),
    ("angle", ("int32",), "float32"),
    ("deg2rad", ("bfloat16",), "bfloat16"),
    ("hypot", ("int8", "uint8"), "float32"),
    ("heaviside", ("int8", "float16"), "float16"),
    ("arctan2", ("int8", "int8"), "float32"),
    ("logaddexp", ("float16", "float16"), "float16"),
    ("maximum", ("bool", "int8"), "int8"),
    ("bitwise_and", ("bool", "int16"), "int16"),
    ("power", ("int8", "float16"), "float16"),
    ("equal", ("int8", "float32"), "bool"),
    ("logical_and", ("int8", "float32"), "bool"),
    ("nan_to_num", ("int8",), "int8"),
    # Keras' lattice demotes 64-bit results (as JAX without x64 does).
    ("float64 add", ("float64", "float64"), "float32"),
    ("float64 add", ("float64", "int32"), "float32"),
    ("int64 add", ("int64", "int32"), "int32"),
    ("int64 sqrt", ("int64",), "float32"),
]


@pytest.mark.parametrize("name,in_dtypes,expected", EXPECTED)
def test_result_dtype_table(name, in_dtypes, expected):
    fn = getattr(E, name.split()[-1])
    out = fn(*(_ones((2,), d) for d in in_dtypes))
    assert _dt(out) == expected


@pytest.mark.parametrize(
    "name,scalar,dtype,expected",
    [
        ("add", 1, "int8", "int8"),
        ("add", 1.0, "int8", "float32"),
        ("add", 1, "float16", "float16"),
        ("multiply", 2.0, "bfloat16", "bfloat16"),
        ("power", 2, "uint8", "uint8"),
        ("maximum", 0.5, "int32", "float32"),
        ("where_scalar", 1.0, "int8", "float32"),
        ("left_shift", 1, "int8", "int8"),
        ("clip", 1, "bool", "int32"),
    ],
)
def test_python_scalars_are_weak(name, scalar, dtype, expected):
    x = _ones((3,), dtype)
    if name == "where_scalar":
        out = E.where(_ones((3,), "bool"), x, scalar)
    elif name == "clip":
        out = E.clip(x, 0, scalar)
    else:
        out = getattr(E, name)(x, scalar)
    assert _dt(out) == expected


RNG = np.random.default_rng(0)
POS = RNG.uniform(0.1, 0.9, (3, 4)).astype("float32")
SIGNED = RNG.uniform(-3, 3, (3, 4)).astype("float32")
INTS = RNG.integers(-20, 20, (3, 4)).astype("int32")
NZ = np.where(INTS == 0, 1, INTS).astype("int32")

UNARY_REF = [
    ("exp", SIGNED, np.exp), ("exp2", SIGNED, np.exp2),
    ("expm1", SIGNED, np.expm1), ("log", POS, np.log),
    ("log10", POS, np.log10), ("log1p", POS, np.log1p),
    ("log2", POS, np.log2), ("sin", SIGNED, np.sin), ("cos", SIGNED, np.cos),
    ("tan", SIGNED, np.tan), ("arcsin", POS, np.arcsin),
    ("arccos", POS, np.arccos), ("arctan", SIGNED, np.arctan),
    ("sinh", SIGNED, np.sinh), ("cosh", SIGNED, np.cosh),
    ("tanh", SIGNED, np.tanh), ("arcsinh", SIGNED, np.arcsinh),
    ("arccosh", 1 + POS, np.arccosh), ("arctanh", POS, np.arctanh),
    ("sqrt", POS, np.sqrt), ("cbrt", SIGNED, np.cbrt),
    ("square", SIGNED, np.square), ("reciprocal", SIGNED, np.reciprocal),
    ("negative", SIGNED, np.negative), ("abs", SIGNED, np.abs),
    ("absolute", INTS, np.abs), ("fabs", INTS, np.fabs),
    ("sign", SIGNED, np.sign), ("ceil", SIGNED, np.ceil),
    ("floor", SIGNED, np.floor), ("trunc", SIGNED, np.trunc),
    ("round", SIGNED, np.round), ("sinc", SIGNED, np.sinc),
    ("i0", SIGNED, np.i0), ("deg2rad", SIGNED, np.deg2rad),
    ("rad2deg", SIGNED, np.rad2deg), ("signbit", SIGNED, np.signbit),
    ("bitwise_invert", INTS, np.invert), ("logical_not", INTS, np.logical_not),
    ("angle", SIGNED, np.angle),
]  # fmt: skip


@pytest.mark.parametrize(
    "name,x,ref", UNARY_REF, ids=[c[0] for c in UNARY_REF]
)
def test_unary_values(name, x, ref):
    np.testing.assert_allclose(
        getattr(E, name)(x), ref(x).astype(np.asarray(getattr(E, name)(x)).dtype),
        rtol=2e-6, atol=1e-6,
    )


BINARY_REF = [
    ("add", SIGNED, POS, np.add), ("subtract", SIGNED, POS, np.subtract),
    ("multiply", SIGNED, POS, np.multiply), ("divide", SIGNED, POS, np.divide),
    ("true_divide", INTS, NZ, np.true_divide),
    ("floor_divide", INTS, NZ, np.floor_divide),
    ("floor_divide", SIGNED, POS, np.floor_divide),
    ("mod", INTS, NZ, np.mod), ("mod", SIGNED, -POS, np.mod),
    ("fmod", INTS, NZ, np.fmod), ("fmod", SIGNED, POS, np.fmod),
    ("power", POS, SIGNED, np.power),
    ("power", INTS, np.abs(INTS) % 4, np.power),
    ("maximum", SIGNED, POS, np.maximum), ("minimum", SIGNED, POS, np.minimum),
    ("arctan2", SIGNED, POS, np.arctan2), ("hypot", SIGNED, POS, np.hypot),
    ("logaddexp", SIGNED, POS, np.logaddexp),
    ("logaddexp2", SIGNED, POS, np.logaddexp2),
    ("nextafter", SIGNED, POS, np.nextafter),
    ("heaviside", np.round(SIGNED), POS, np.heaviside),
    ("gcd", INTS, NZ, np.gcd), ("lcm", INTS, NZ, np.lcm),
    ("bitwise_and", INTS, NZ, np.bitwise_and),
    ("bitwise_or", INTS, NZ, np.bitwise_or),
    ("bitwise_xor", INTS, NZ, np.bitwise_xor),
    ("left_shift", INTS, np.abs(NZ) % 5, np.left_shift),
    ("right_shift", INTS, np.abs(NZ) % 5, np.right_shift),
    ("equal", INTS, NZ, np.equal), ("not_equal", INTS, NZ, np.not_equal),
    ("greater", SIGNED, POS, np.greater), ("less", SIGNED, POS, np.less),
    ("greater_equal", INTS, NZ, np.greater_equal),
    ("less_equal", INTS, NZ, np.less_equal),
    ("logical_and", INTS, SIGNED, np.logical_and),
    ("logical_or", INTS, SIGNED, np.logical_or),
    ("logical_xor", INTS, SIGNED, np.logical_xor),
]  # fmt: skip


@pytest.mark.parametrize(
    "name,x1,x2,ref", BINARY_REF, ids=[f"{c[0]}-{c[1].dtype}" for c in BINARY_REF]
)
def test_binary_values(name, x1, x2, ref):
    out = getattr(E, name)(x1, x2)
    np.testing.assert_allclose(out, ref(x1, x2), rtol=2e-6, atol=1e-6)


def test_ldexp_values_and_range():
    x = np.array([0.5, -3.0, 1e-30, 1.5], "float32")
    e = np.array([3, -2, 200, 127], "int32")
    np.testing.assert_allclose(E.ldexp(x, e), np.ldexp(x, e), rtol=1e-6)
    with pytest.raises(TypeError, match="integer type"):
        E.ldexp(x, x)


def test_special_values_of_float_ops():
    x = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0], "float32")
    np.testing.assert_array_equal(E.isnan(x), np.isnan(x))
    np.testing.assert_array_equal(E.isinf(x), np.isinf(x))
    np.testing.assert_array_equal(E.isfinite(x), np.isfinite(x))
    np.testing.assert_array_equal(E.isposinf(x), np.isposinf(x))
    np.testing.assert_array_equal(E.isneginf(x), np.isneginf(x))
    np.testing.assert_array_equal(E.signbit(x), np.signbit(x))
    np.testing.assert_array_equal(E.nan_to_num(x), np.nan_to_num(x))
    np.testing.assert_array_equal(
        E.nan_to_num(x, nan=1.0, posinf=2.0, neginf=-2.0),
        np.nan_to_num(x, nan=1.0, posinf=2.0, neginf=-2.0),
    )
    y = np.array([1.0, np.nan, 2.0, np.nan], "float32")
    z = np.array([np.nan, np.nan, 1.0, 3.0], "float32")
    np.testing.assert_array_equal(E.fmax(y, z), np.fmax(y, z))
    np.testing.assert_array_equal(E.fmin(y, z), np.fmin(y, z))
    np.testing.assert_array_equal(E.maximum(y, z), np.maximum(y, z))
    np.testing.assert_allclose(E.sinc(np.float32([0.0, 0.5])), np.sinc([0.0, 0.5]))
    np.testing.assert_array_equal(
        E.heaviside(np.float32([np.nan, 0, -1]), 0.5), [np.nan, 0.5, 0]
    )


def test_isclose_and_allclose():
    a = np.array([1.0, np.inf, -np.inf, np.nan, 1.0, 0.0], "float32")
    b = np.array([1.0 + 1e-7, np.inf, np.inf, np.nan, 1.1, 1e-9], "float32")
    np.testing.assert_array_equal(E.isclose(a, b), np.isclose(a, b))
    np.testing.assert_array_equal(
        E.isclose(a, b, equal_nan=True), np.isclose(a, b, equal_nan=True)
    )
    np.testing.assert_array_equal(
        E.isclose(a, b, rtol=0.2, atol=0.0), np.isclose(a, b, rtol=0.2, atol=0.0)
    )
    assert bool(E.allclose(a[:2], b[:2]))
    assert not bool(E.allclose(a, b))
    assert bool(E.allclose(np.int32([1, 2]), np.int32([1, 2])))


def test_divide_no_nan_and_division_by_zero():
    x = np.array([1.0, -1.0, 0.0, 3.0], "float32")
    y = np.array([0.0, 0.0, 0.0, 2.0], "float32")
    np.testing.assert_array_equal(E.divide_no_nan(x, y), [0.0, 0.0, 0.0, 1.5])
    np.testing.assert_array_equal(E.divide(x, y)[:2], [np.inf, -np.inf])


def test_round_decimals():
    x = np.array([1.2345, -2.5, 12.5], "float32")
    np.testing.assert_allclose(E.round(x, 2), np.round(x, 2), rtol=1e-6)
    i = np.array([1234, 1250, -1351], "int32")
    np.testing.assert_array_equal(E.round(i, -2), np.round(i, -2))
    assert _dt(E.round(i, -2)) == "int32"


def test_clip_keeps_x_dtype():
    x = np.array([-3, 0, 7], "int8")
    out = E.clip(x, -1, 5)
    np.testing.assert_array_equal(out, [-1, 0, 5])
    assert _dt(out) == "int8"
    np.testing.assert_array_equal(E.clip(np.float32([0.2, 5]), 0.5, 1.0), [0.5, 1.0])
    np.testing.assert_array_equal(E.clip(x, None, 2), [-3, 0, 2])


def test_complex_ops():
    z = np.array([3 + 4j, -1 - 1j, 2 + 0j], "complex64")
    np.testing.assert_allclose(E.abs(z), np.abs(z), rtol=1e-6)
    np.testing.assert_allclose(E.real(z), np.real(z))
    np.testing.assert_allclose(E.imag(z), np.imag(z))
    np.testing.assert_allclose(E.conj(z), np.conj(z))
    np.testing.assert_allclose(E.angle(z), np.angle(z), rtol=1e-6)
    np.testing.assert_array_equal(E.isreal(z), np.isreal(z))
    np.testing.assert_allclose(E.exp(z), np.exp(z), rtol=1e-6)
    assert _dt(E.abs(z)) == "float32"
    np.testing.assert_array_equal(E.isreal(np.float32([1, 2])), [True, True])
    w = np.array([complex(np.nan, np.inf)], "complex64")
    np.testing.assert_allclose(E.nan_to_num(w), np.nan_to_num(w))


def test_where_and_select():
    c = np.array([True, False, True])
    np.testing.assert_array_equal(E.where(c, 1.0, np.float32([5, 6, 7])), [1, 6, 1])
    # A non-bool condition is tested against zero.
    np.testing.assert_array_equal(E.where(np.int32([0, 2, 0]), 1, 0), [0, 1, 0])
    with pytest.raises(ValueError, match="both"):
        E.where(c, 1.0)
    x = np.arange(-2, 3).astype("float32")
    out = E.select([x < 0, x > 0], [-x, x * 10], default=7)
    np.testing.assert_array_equal(out, np.select([x < 0, x > 0], [-x, x * 10], 7))
    with pytest.raises(ValueError, match="same length"):
        E.select([x < 0], [x, x])


def test_where_with_condition_only_is_nonzero():
    from keras_ipu.backend.numpy import arrays

    if not hasattr(arrays, "nonzero"):
        pytest.skip("arrays.nonzero is not written yet")
    c = np.array([[0, 1], [2, 0]])
    out = E.where(c)
    ref = np.nonzero(c)
    assert len(out) == len(ref)
    for o, r in zip(out, ref):
        np.testing.assert_array_equal(o, r)


def test_view():
    x = np.arange(16, dtype="float32").reshape(2, 8)
    np.testing.assert_array_equal(E.view(x, "int16"), x.view("int16"))
    np.testing.assert_array_equal(E.view(x, "int32"), x.view("int32"))
    assert E.view(x, "float64").shape == (2, 4)
    with pytest.raises(ValueError, match="0-d"):
        E.view(np.array(1, "int16"), "int8")
    spec = ops.view(keras.KerasTensor((None, 8), dtype="float32"), "int16")
    assert spec.shape == (None, 16)


def test_user_errors_name_the_fix():
    b = np.array([True, False])
    with pytest.raises(TypeError, match="logical_xor"):
        E.subtract(b, b)
    with pytest.raises(TypeError, match="logical_not"):
        E.negative(b)
    with pytest.raises(TypeError, match="complex"):
        E.fabs(np.complex64([1j]))
    with pytest.raises(TypeError, match="integer"):
        E.gcd(np.float32([1.0]), np.float32([2.0]))
    with pytest.raises(TypeError, match="integer or bool"):
        E.bitwise_and(np.float32([1.0]), np.float32([2.0]))


def test_traced_graph_is_built_from_primitives():
    from keras_ipu.device.ir import ShapedArray
    from keras_ipu.device.trace import GraphBuilder
    from keras_ipu.device.trace import tracing

    builder = GraphBuilder()
    x = builder.new_input(ShapedArray((None, 4), np.float32))
    with tracing(builder):
        out = E.isclose(E.sinc(x), E.nan_to_num(x))
    assert out.aval == ShapedArray((None, 4), np.bool_)
    names = {n.primitive.name for n in builder.graph.nodes}
    assert {"sin", "select", "isnan", "le"} <= names
