"""Elementwise primitives: arithmetic, transcendental, comparison, logic.

Operands of an n-ary primitive share one dtype and broadcast NumPy-style;
the backend promotes dtypes (Keras' rules) before it binds. Every kernel
returns exactly the dtype its shape rule announces: NumPy would sometimes
promote (bool arithmetic to int8, `np.angle` of float32 to float64), and an
eager result must never differ from what tracing predicted.
"""

import numpy as np

from keras_ipu.device.ir import ShapedArray
from keras_ipu.device.primitives import shape_rules
from keras_ipu.device.primitives.registry import Primitive

BOOL = np.dtype(bool)

_INT_OUT = "integer or boolean output"


def _real_dtype(dtype):
    if dtype.kind == "c":
        return np.dtype(np.float32 if dtype.itemsize == 8 else np.float64)
    return dtype


def exact_kernel(rule, fn):
    """Wrap a NumPy function so its result has the dtype `rule` gives.

    Floating-point exceptions (division by zero, overflow, invalid) are the
    expected IEEE results here, not errors: NumPy's warnings are silenced as
    the IPU's default (no fp exception traps) would.
    """

    def kernel(*xs, **params):
        xs = [np.asarray(x) for x in xs]
        out_dtype = rule(*(ShapedArray(x.shape, x.dtype) for x in xs), **params)
        out_dtype = out_dtype.dtype
        with np.errstate(all="ignore"):
            out = np.asarray(fn(*xs, **params))
        if out.dtype != out_dtype:
            with np.errstate(all="ignore"):
                out = out.astype(out_dtype)
        return out

    kernel.__name__ = getattr(fn, "__name__", "kernel")
    return kernel


def unary(name, fn, dtype=None, nondiff=None):
    rule = shape_rules.elementwise(dtype)
    return Primitive(name, rule, exact_kernel(rule, fn), nondiff=nondiff)


# n-ary: the same rule and kernel wrapper serve binary primitives.
binary = unary


def _rsqrt(x):
    return np.reciprocal(np.sqrt(x))


def _logistic(x):
    # Stable in both tails: exp of a non-positive number only.
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e))


def _sign(x):
    if x.dtype == BOOL:
        return x
    return np.sign(x)


def _int_pow(x, y):
    """x ** y; integer powers with negative exponents give the truncated
    result (1, -1 or 0) as on the device, where NumPy raises."""
    if x.dtype.kind not in "iu":
        return np.power(x, y)
    if x.dtype.kind == "u":
        return np.power(x, y)
    negative = y < 0
    out = np.power(x, np.where(negative, 0, y))
    odd = (y % 2) != 0
    inverse = np.where(x == 1, 1, np.where(x == -1, np.where(odd, -1, 1), 0))
    return np.where(negative, inverse.astype(x.dtype), out)


def _bool_arith(fn):
    """NumPy refuses or widens some bool arithmetic; on bool operands the
    result is computed on uint8 and cast back by `exact_kernel`."""

    def wrapped(*xs):
        if xs[0].dtype == BOOL:
            xs = [x.astype(np.uint8) for x in xs]
        return fn(*xs)

    wrapped.__name__ = fn.__name__
    return wrapped


def _shift_left(x, y):
    bits = x.dtype.itemsize * 8
    # Shifting by the width or more gives 0 (NumPy's C shift is undefined).
    big = (y < 0) | (y >= bits)
    return np.where(big, 0, np.left_shift(x, np.where(big, 0, y)))


def _shift_right(x, y):
    bits = x.dtype.itemsize * 8
    big = (y < 0) | (y >= bits)
    fill = np.where(x < 0, -1, 0) if x.dtype.kind == "i" else 0
    return np.where(big, fill, np.right_shift(x, np.where(big, 0, y)))


neg_p = unary("neg", _bool_arith(np.negative))
abs_p = unary("abs", np.abs, dtype=_real_dtype)
sign_p = unary("sign", _sign)
floor_p = unary("floor", np.floor)
ceil_p = unary("ceil", np.ceil)
# Round half to even, as NumPy and XLA's round_nearest_even.
round_p = unary("round", np.round)
trunc_p = unary("trunc", np.trunc)
exp_p = unary("exp", np.exp)
exp2_p = unary("exp2", np.exp2)
expm1_p = unary("expm1", np.expm1)
log_p = unary("log", np.log)
log1p_p = unary("log1p", np.log1p)
log2_p = unary("log2", np.log2)
log10_p = unary("log10", np.log10)
sqrt_p = unary("sqrt", np.sqrt)
rsqrt_p = unary("rsqrt", _rsqrt)
cbrt_p = unary("cbrt", np.cbrt)
reciprocal_p = unary("reciprocal", np.reciprocal)
square_p = unary("square", _bool_arith(np.square))
sin_p = unary("sin", np.sin)
cos_p = unary("cos", np.cos)
tan_p = unary("tan", np.tan)
asin_p = unary("asin", np.arcsin)
acos_p = unary("acos", np.arccos)
atan_p = unary("atan", np.arctan)
sinh_p = unary("sinh", np.sinh)
cosh_p = unary("cosh", np.cosh)
tanh_p = unary("tanh", np.tanh)
asinh_p = unary("asinh", np.arcsinh)
acosh_p = unary("acosh", np.arccosh)
atanh_p = unary("atanh", np.arctanh)
logistic_p = unary("logistic", _logistic)
conj_p = unary("conj", np.conjugate)
real_p = unary("real", np.real, dtype=_real_dtype)
imag_p = unary("imag", np.imag, dtype=_real_dtype)
angle_p = unary("angle", np.angle, dtype=_real_dtype)
not_p = unary("not", np.invert, nondiff=_INT_OUT)
logical_not_p = unary("logical_not", np.logical_not, dtype=BOOL, nondiff=_INT_OUT)
isnan_p = unary("isnan", np.isnan, dtype=BOOL, nondiff=_INT_OUT)
isinf_p = unary("isinf", np.isinf, dtype=BOOL, nondiff=_INT_OUT)
isfinite_p = unary("isfinite", np.isfinite, dtype=BOOL, nondiff=_INT_OUT)
signbit_p = unary(
    "signbit", _bool_arith(np.signbit), dtype=BOOL, nondiff=_INT_OUT
)
popcount_p = unary("population_count", np.bitwise_count, nondiff=_INT_OUT)

add_p = binary("add", _bool_arith(np.add))
sub_p = binary("sub", _bool_arith(np.subtract))
mul_p = binary("mul", _bool_arith(np.multiply))
div_p = binary("div", np.true_divide)
floor_div_p = binary("floor_div", _bool_arith(np.floor_divide))
# rem: sign of the dividend (C fmod); mod: sign of the divisor (Python %).
rem_p = binary("rem", _bool_arith(np.fmod))
mod_p = binary("mod", _bool_arith(np.mod))
pow_p = binary("pow", _bool_arith(_int_pow))
max_p = binary("max", np.maximum)
min_p = binary("min", np.minimum)
atan2_p = binary("atan2", np.arctan2)
hypot_p = binary("hypot", np.hypot)
copysign_p = binary("copysign", np.copysign)
nextafter_p = binary("nextafter", np.nextafter, nondiff="piecewise constant")
logaddexp_p = binary("logaddexp", np.logaddexp)
logaddexp2_p = binary("logaddexp2", np.logaddexp2)
and_p = binary("and", np.bitwise_and, nondiff=_INT_OUT)
or_p = binary("or", np.bitwise_or, nondiff=_INT_OUT)
xor_p = binary("xor", np.bitwise_xor, nondiff=_INT_OUT)
shift_left_p = binary("shift_left", _shift_left, nondiff=_INT_OUT)
shift_right_p = binary("shift_right", _shift_right, nondiff=_INT_OUT)
gcd_p = binary("gcd", np.gcd, nondiff=_INT_OUT)
lcm_p = binary("lcm", np.lcm, nondiff=_INT_OUT)
eq_p = binary("eq", np.equal, dtype=BOOL, nondiff=_INT_OUT)
ne_p = binary("ne", np.not_equal, dtype=BOOL, nondiff=_INT_OUT)
lt_p = binary("lt", np.less, dtype=BOOL, nondiff=_INT_OUT)
le_p = binary("le", np.less_equal, dtype=BOOL, nondiff=_INT_OUT)
gt_p = binary("gt", np.greater, dtype=BOOL, nondiff=_INT_OUT)
ge_p = binary("ge", np.greater_equal, dtype=BOOL, nondiff=_INT_OUT)


def _select_rule(pred, on_true, on_false):
    if pred.dtype != BOOL:
        raise TypeError(
            f"select: the predicate must be bool, got {pred.dtype}; compare "
            "it with 0 first (the backend's `where` does)."
        )
    dtype = shape_rules.same_dtype(on_true, on_false)
    shape = shape_rules.broadcast_shapes(pred.shape, on_true.shape, on_false.shape)
    return ShapedArray(shape, dtype)


# select(pred, on_true, on_false): the elementwise `where`.
select_p = Primitive("select", _select_rule, exact_kernel(_select_rule, np.where))


def _clamp_rule(lo, x, hi):
    return shape_rules.elementwise()(lo, x, hi)


def _clamp(lo, x, hi):
    return np.minimum(np.maximum(x, lo), hi)


# clamp(lo, x, hi), as lax.clamp: NaN bounds propagate like max/min.
clamp_p = Primitive("clamp", _clamp_rule, exact_kernel(_clamp_rule, _clamp))


# Special functions live in special.py (SciPy-backed); they are elementwise
# too, so they can be imported from here. Looked up lazily: special.py builds
# on this module.
_SPECIAL = ("digamma_p", "erf_p", "erfc_p", "erfinv_p", "i0_p", "i0e_p", "i1_p",
            "i1e_p", "lgamma_p", "igamma_p", "igammac_p", "betainc_p")


def __getattr__(name):
    if name in _SPECIAL:
        from keras_ipu.device.primitives import special

        return getattr(special, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
