"""Elementwise primitives: arithmetic, transcendental, comparison, logic.

Operands of an n-ary primitive share one dtype and broadcast NumPy-style;
the backend promotes dtypes (Keras' rules) before it binds. Every kernel
returns exactly the dtype its shape rule announces: NumPy would sometimes
promote (bool arithmetic to int8, `np.angle` of float32 to float64), and an
eager result must never differ from what tracing predicted.

Gradient rules: grads/elementwise.py (registered once every primitive exists).
"""

import numpy as np

from keras_ipu.device.ir import ShapedArray
from keras_ipu.device.primitives import cost_util as _cost
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


# Cost rules (formulas and constants: keras_ipu/device/simulator/cost_model.py):
# one vector op per element; transcendentals are sequences of vector ops.
ONE_OP = _cost.elementwise(1)
TRANSCENDENTAL = _cost.transcendental


def declare(name, fn, dtype=None, *, nondiff=None, fp_class="elementwise", cost=ONE_OP,
            **facts):
    """An elementwise primitive of any arity computing `fn` (operands of one
    dtype, broadcast; result of `dtype`, default theirs). fp_class None: its
    result is exact (no rounding, no overflow from finite inputs). `facts`:
    ufunc, ufunc_kinds, ieee_exact, float_kernel (registry.Primitive)."""
    rule = shape_rules.elementwise(dtype)
    prim = Primitive(name, rule, exact_kernel(rule, fn), nondiff=nondiff,
                     elementwise=True, fp_class=fp_class, **facts)
    prim.cost = cost
    return prim


def rsqrt(x):
    return np.reciprocal(np.sqrt(x))


def logistic(x):
    # Stable in both tails: exp of a non-positive number only.
    if x.dtype.kind != "f" or x.ndim == 0:
        e = np.exp(-np.abs(x))
        return np.where(x >= 0, 1 / (1 + e), e / (1 + e))
    # The same values as that where(): 1 / (1 + e) for x >= 0, e / (1 + e)
    # below, with e = exp(-|x|): the numerator (1 or e) is picked bitwise,
    # e ^ (mask & (e ^ 1)), as np.where branches per element (slow on a
    # random sign pattern). One exp, in place where possible.
    e = np.abs(x)
    np.negative(e, out=e)
    np.exp(e, out=e)
    d = np.add(e, 1)
    uint = np.dtype(f"u{x.dtype.itemsize}")
    mask = np.negative(np.greater_equal(x, 0).view(np.uint8), dtype=uint)
    e_bits = e.view(uint)
    num = np.bitwise_xor(e_bits, np.asarray(1, x.dtype).view(uint))
    np.bitwise_and(num, mask, out=num)
    np.bitwise_xor(num, e_bits, out=num)
    num = num.view(x.dtype)
    return np.divide(num, d, out=num)


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


neg_p = declare("neg", _bool_arith(np.negative), fp_class=None, ufunc=np.negative,
                ufunc_kinds="fiu", ieee_exact=True)
abs_p = declare("abs", np.abs, dtype=_real_dtype, fp_class=None, ufunc=np.absolute,
                ufunc_kinds="f", ieee_exact=True)
sign_p = declare("sign", _sign, fp_class=None)
floor_p = declare("floor", np.floor, fp_class=None, ufunc=np.floor, ufunc_kinds="f",
                  ieee_exact=True)
ceil_p = declare("ceil", np.ceil, fp_class=None, ufunc=np.ceil, ufunc_kinds="f",
                 ieee_exact=True)
# Round half to even, as NumPy and XLA's round_nearest_even.
round_p = declare("round", np.round, fp_class=None)
trunc_p = declare("trunc", np.trunc, fp_class=None)
exp_p = declare("exp", np.exp, ufunc=np.exp, ufunc_kinds="f", cost=TRANSCENDENTAL)
exp2_p = declare("exp2", np.exp2, cost=TRANSCENDENTAL)
expm1_p = declare("expm1", np.expm1, ufunc=np.expm1, ufunc_kinds="f", cost=TRANSCENDENTAL)
log_p = declare("log", np.log, ufunc=np.log, ufunc_kinds="f", cost=TRANSCENDENTAL)
log1p_p = declare("log1p", np.log1p, ufunc=np.log1p, ufunc_kinds="f", cost=TRANSCENDENTAL)
log2_p = declare("log2", np.log2, cost=TRANSCENDENTAL)
log10_p = declare("log10", np.log10, cost=TRANSCENDENTAL)
sqrt_p = declare("sqrt", np.sqrt, ufunc=np.sqrt, ufunc_kinds="f", ieee_exact=True,
                 cost=TRANSCENDENTAL)
rsqrt_p = declare("rsqrt", rsqrt, float_kernel=rsqrt, cost=TRANSCENDENTAL)
cbrt_p = declare("cbrt", np.cbrt, cost=TRANSCENDENTAL)
reciprocal_p = declare("reciprocal", np.reciprocal, ufunc=np.reciprocal,
                       ufunc_kinds="f", ieee_exact=True)
square_p = declare("square", _bool_arith(np.square), ufunc=np.square, ufunc_kinds="f",
                   ieee_exact=True)
sin_p = declare("sin", np.sin, ufunc=np.sin, ufunc_kinds="f", cost=TRANSCENDENTAL)
cos_p = declare("cos", np.cos, ufunc=np.cos, ufunc_kinds="f", cost=TRANSCENDENTAL)
tan_p = declare("tan", np.tan, cost=TRANSCENDENTAL)
asin_p = declare("asin", np.arcsin, cost=TRANSCENDENTAL)
acos_p = declare("acos", np.arccos, cost=TRANSCENDENTAL)
atan_p = declare("atan", np.arctan, cost=TRANSCENDENTAL)
sinh_p = declare("sinh", np.sinh, cost=TRANSCENDENTAL)
cosh_p = declare("cosh", np.cosh, cost=TRANSCENDENTAL)
tanh_p = declare("tanh", np.tanh, ufunc=np.tanh, ufunc_kinds="f", cost=TRANSCENDENTAL)
asinh_p = declare("asinh", np.arcsinh, cost=TRANSCENDENTAL)
acosh_p = declare("acosh", np.arccosh, cost=TRANSCENDENTAL)
atanh_p = declare("atanh", np.arctanh, cost=TRANSCENDENTAL)
logistic_p = declare("logistic", logistic, float_kernel=logistic, cost=TRANSCENDENTAL)
conj_p = declare("conj", np.conjugate, fp_class=None)
real_p = declare("real", np.real, dtype=_real_dtype, fp_class=None)
imag_p = declare("imag", np.imag, dtype=_real_dtype, fp_class=None)
angle_p = declare("angle", np.angle, dtype=_real_dtype, cost=TRANSCENDENTAL)
not_p = declare("not", np.invert, nondiff=_INT_OUT, ufunc=np.invert, ufunc_kinds="biu",
                ieee_exact=True)
logical_not_p = declare("logical_not", np.logical_not, dtype=BOOL, nondiff=_INT_OUT)
isnan_p = declare("isnan", np.isnan, dtype=BOOL, nondiff=_INT_OUT)
isinf_p = declare("isinf", np.isinf, dtype=BOOL, nondiff=_INT_OUT)
isfinite_p = declare("isfinite", np.isfinite, dtype=BOOL, nondiff=_INT_OUT)
signbit_p = declare("signbit", _bool_arith(np.signbit), dtype=BOOL, nondiff=_INT_OUT)
popcount_p = declare("population_count", np.bitwise_count, nondiff=_INT_OUT)

add_p = declare("add", _bool_arith(np.add), ufunc=np.add, ufunc_kinds="fiu",
                ieee_exact=True)
sub_p = declare("sub", _bool_arith(np.subtract), ufunc=np.subtract, ufunc_kinds="fiu",
                ieee_exact=True)
mul_p = declare("mul", _bool_arith(np.multiply), ufunc=np.multiply, ufunc_kinds="fiu",
                ieee_exact=True)
div_p = declare("div", np.true_divide, ufunc=np.true_divide, ufunc_kinds="f",
                ieee_exact=True)
floor_div_p = declare("floor_div", _bool_arith(np.floor_divide))
# rem: sign of the dividend (C fmod); mod: sign of the divisor (Python %).
rem_p = declare("rem", _bool_arith(np.fmod))
mod_p = declare("mod", _bool_arith(np.mod))
pow_p = declare("pow", _bool_arith(_int_pow), ufunc=np.power, ufunc_kinds="f",
                cost=TRANSCENDENTAL)
max_p = declare("max", np.maximum, fp_class=None, ufunc=np.maximum, ufunc_kinds="fiu",
                ieee_exact=True)
min_p = declare("min", np.minimum, fp_class=None, ufunc=np.minimum, ufunc_kinds="fiu",
                ieee_exact=True)
atan2_p = declare("atan2", np.arctan2, cost=TRANSCENDENTAL)
hypot_p = declare("hypot", np.hypot, cost=TRANSCENDENTAL)
copysign_p = declare("copysign", np.copysign, fp_class=None)
nextafter_p = declare("nextafter", np.nextafter, nondiff="piecewise constant",
                      fp_class=None, cost=TRANSCENDENTAL)
logaddexp_p = declare("logaddexp", np.logaddexp, cost=TRANSCENDENTAL)
logaddexp2_p = declare("logaddexp2", np.logaddexp2, cost=TRANSCENDENTAL)
and_p = declare("and", np.bitwise_and, nondiff=_INT_OUT, ufunc=np.bitwise_and,
                ufunc_kinds="biu", ieee_exact=True)
or_p = declare("or", np.bitwise_or, nondiff=_INT_OUT, ufunc=np.bitwise_or,
               ufunc_kinds="biu", ieee_exact=True)
xor_p = declare("xor", np.bitwise_xor, nondiff=_INT_OUT, ufunc=np.bitwise_xor,
                ufunc_kinds="biu", ieee_exact=True)
shift_left_p = declare("shift_left", _shift_left, nondiff=_INT_OUT)
shift_right_p = declare("shift_right", _shift_right, nondiff=_INT_OUT)
gcd_p = declare("gcd", np.gcd, nondiff=_INT_OUT, cost=TRANSCENDENTAL)
lcm_p = declare("lcm", np.lcm, nondiff=_INT_OUT, cost=TRANSCENDENTAL)
eq_p = declare("eq", np.equal, dtype=BOOL, nondiff=_INT_OUT, ufunc=np.equal,
               ufunc_kinds="*", ieee_exact=True)
ne_p = declare("ne", np.not_equal, dtype=BOOL, nondiff=_INT_OUT, ufunc=np.not_equal,
               ufunc_kinds="*", ieee_exact=True)
lt_p = declare("lt", np.less, dtype=BOOL, nondiff=_INT_OUT, ufunc=np.less,
               ufunc_kinds="*", ieee_exact=True)
le_p = declare("le", np.less_equal, dtype=BOOL, nondiff=_INT_OUT, ufunc=np.less_equal,
               ufunc_kinds="*", ieee_exact=True)
gt_p = declare("gt", np.greater, dtype=BOOL, nondiff=_INT_OUT, ufunc=np.greater,
               ufunc_kinds="*", ieee_exact=True)
ge_p = declare("ge", np.greater_equal, dtype=BOOL, nondiff=_INT_OUT,
               ufunc=np.greater_equal, ufunc_kinds="*", ieee_exact=True)


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
select_p = Primitive("select", _select_rule, exact_kernel(_select_rule, np.where),
                     elementwise=True, ieee_exact=True)
select_p.cost = ONE_OP


def _clamp_rule(lo, x, hi):
    return shape_rules.elementwise()(lo, x, hi)


def _clamp(lo, x, hi):
    return np.minimum(np.maximum(x, lo), hi)


# clamp(lo, x, hi), as lax.clamp: NaN bounds propagate like max/min.
clamp_p = Primitive("clamp", _clamp_rule, exact_kernel(_clamp_rule, _clamp),
                    elementwise=True)
clamp_p.cost = ONE_OP
