"""Elementwise primitives: arithmetic, transcendental, comparison, logic.

Operands of an n-ary primitive share one dtype and broadcast NumPy-style;
the backend promotes dtypes (Keras' rules) before it binds.
"""

import numpy as np

from keras_ipu.device.primitives import shape_rules
from keras_ipu.device.primitives.registry import Primitive

BOOL = np.dtype(bool)


def _real_dtype(dtype):
    if dtype.kind == "c":
        return np.dtype(np.float32 if dtype.itemsize == 8 else np.float64)
    return dtype


def _keep_dtype(fn):
    """NumPy promotes some small types (float16 sqrt of ints, bfloat16
    corner cases); the device keeps the operand dtype."""

    def kernel(*xs):
        out = fn(*xs)
        dtype = np.result_type(*xs) if len(xs) > 1 else np.asarray(xs[0]).dtype
        if out.dtype != dtype:
            out = out.astype(dtype)
        return out

    kernel.__name__ = getattr(fn, "__name__", "kernel")
    return kernel


def _scipy_special(name):
    def kernel(x):
        from scipy import special  # lazy: only when the kernel first runs

        dtype = x.dtype
        # scipy.special has no bfloat16/float16 loops.
        out = getattr(special, name)(x.astype(np.float32) if dtype.itemsize < 4 else x)
        return out.astype(dtype)

    kernel.__name__ = name
    return kernel


def _rsqrt(x):
    return np.reciprocal(np.sqrt(x))


def _logistic(x):
    # Stable in both tails: exp of a non-positive number only.
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e)).astype(x.dtype)


def _round_half_even(x):
    return np.round(x)


def _python_mod(x, y):
    return np.mod(x, y)


def _int_pow(x, y):
    return np.power(x, y)


def _shift_right(x, y):
    return np.right_shift(x, y)


def unary(name, kernel, dtype=None, nondiff=None):
    return Primitive(
        name,
        shape_rules.elementwise(dtype),
        _keep_dtype(kernel) if dtype is None else kernel,
        nondiff=nondiff,
    )


def binary(name, kernel, dtype=None, nondiff=None):
    return Primitive(
        name,
        shape_rules.elementwise(dtype),
        _keep_dtype(kernel) if dtype is None else kernel,
        nondiff=nondiff,
    )


_INT_OUT = "integer or boolean output"

neg_p = unary("neg", np.negative)
abs_p = unary("abs", np.abs, dtype=_real_dtype)
sign_p = unary("sign", np.sign)
floor_p = unary("floor", np.floor)
ceil_p = unary("ceil", np.ceil)
round_p = unary("round", _round_half_even)
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
square_p = unary("square", np.square)
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
erf_p = unary("erf", _scipy_special("erf"))
erfinv_p = unary("erfinv", _scipy_special("erfinv"))
lgamma_p = unary("lgamma", _scipy_special("gammaln"))
digamma_p = unary("digamma", _scipy_special("digamma"))
i0_p = unary("i0", _scipy_special("i0"))
conj_p = unary("conj", np.conjugate)
real_p = unary("real", np.real, dtype=_real_dtype)
imag_p = unary("imag", np.imag, dtype=_real_dtype)
angle_p = unary("angle", np.angle, dtype=_real_dtype)
not_p = unary("not", np.invert, nondiff=_INT_OUT)
logical_not_p = unary("logical_not", np.logical_not, dtype=BOOL, nondiff=_INT_OUT)
isnan_p = unary("isnan", np.isnan, dtype=BOOL, nondiff=_INT_OUT)
isinf_p = unary("isinf", np.isinf, dtype=BOOL, nondiff=_INT_OUT)
isfinite_p = unary("isfinite", np.isfinite, dtype=BOOL, nondiff=_INT_OUT)
signbit_p = unary("signbit", np.signbit, dtype=BOOL, nondiff=_INT_OUT)
popcount_p = unary("population_count", np.bitwise_count, nondiff=_INT_OUT)

add_p = binary("add", np.add)
sub_p = binary("sub", np.subtract)
mul_p = binary("mul", np.multiply)
div_p = binary("div", np.true_divide)
floor_div_p = binary("floor_div", np.floor_divide)
rem_p = binary("rem", np.fmod)
mod_p = binary("mod", _python_mod)
pow_p = binary("pow", _int_pow)
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
shift_left_p = binary("shift_left", np.left_shift, nondiff=_INT_OUT)
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
        raise TypeError(f"select: predicate must be bool, got {pred.dtype}")
    dtype = shape_rules.same_dtype(on_true, on_false)
    shape = shape_rules.broadcast_shapes(pred.shape, on_true.shape, on_false.shape)
    from keras_ipu.device.ir import ShapedArray

    return ShapedArray(shape, dtype)


# select(pred, on_true, on_false): the elementwise `where`.
select_p = Primitive("select", _select_rule, np.where)


def _clamp_rule(lo, x, hi):
    return shape_rules.elementwise()(lo, x, hi)


def _clamp(lo, x, hi):
    return np.minimum(np.maximum(x, lo), hi)


clamp_p = Primitive("clamp", _clamp_rule, _keep_dtype(_clamp))
