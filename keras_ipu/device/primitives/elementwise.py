"""Elementwise primitives: arithmetic, transcendental, comparison, logic.

Operands of an n-ary primitive share one dtype and broadcast NumPy-style;
the backend promotes dtypes (Keras' rules) before it binds. Every kernel
returns exactly the dtype its shape rule announces: NumPy would sometimes
promote (bool arithmetic to int8, `np.angle` of float32 to float64), and an
eager result must never differ from what tracing predicted.
"""

import numpy as np

from keras_ipu.device.ir import ShapedArray
# ad_util imports primitive modules only inside its functions: no cycle.
from keras_ipu.device.primitives import ad_util
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


# -- gradient rules (contract: keras_ipu/device/autodiff.py) -----------------


def _c(value, like):
    return ad_util.scalar(value, like.dtype)


def _mul(a, b):
    return mul_p.bind(a, b)


def _div(a, b):
    return div_p.bind(a, b)


def _add(a, b):
    return add_p.bind(a, b)


def _sub(a, b):
    return sub_p.bind(a, b)


def _neg(a):
    return neg_p.bind(a)


def _square(a):
    return mul_p.bind(a, a)


def unary_grad(derivative):
    """Rule for y = f(x): x_ct = g * derivative(x, y). special.py uses it
    too."""

    def rule(cts, inputs, outputs, **params):
        (g,), (x,), (y,) = cts, inputs, outputs
        return [_mul(g, derivative(x, y))]

    return rule


def _zero_rule(cts, inputs, outputs, **params):
    return [None] * len(inputs)


def _abs_grad(cts, inputs, outputs):
    (g,), (x,), (y,) = cts, inputs, outputs
    if x.dtype.kind != "c":
        return [_mul(g, sign_p.bind(x))]
    # d|z| = Re(conj(z) dz) / |z|: the cotangent is g conj(z) / |z| (zero
    # at z = 0).
    is_zero = eq_p.bind(y, _c(0, y))
    scale = _div(g, select_p.bind(is_zero, _c(1, y), y))
    scale = select_p.bind(is_zero, _c(0, scale), scale)
    return [_mul(ad_util.convert(scale, x.dtype), conj_p.bind(x))]


def _real_grad(cts, inputs, outputs):
    (g,), (x,) = cts, inputs
    return [ad_util.convert(g, x.dtype)]


def _imag_grad(cts, inputs, outputs):
    (g,), (x,) = cts, inputs
    if x.dtype.kind != "c":
        return [None]
    # imag(x) = Re(-i x): the transpose maps g to -i g.
    return [_mul(ad_util.convert(g, x.dtype), ad_util.scalar(-1j, x.dtype))]


def _angle_grad(cts, inputs, outputs):
    (g,), (x,) = cts, inputs
    if x.dtype.kind != "c":
        return [None]  # 0 or pi: piecewise constant on real numbers
    # d angle(z) = Im(dz / z) = Re(-i conj(z) dz) / |z|^2.
    sq = real_p.bind(_mul(x, conj_p.bind(x)))
    scale = _div(g, sq)
    return [_mul(ad_util.convert(scale, x.dtype),
                 _mul(conj_p.bind(x), ad_util.scalar(-1j, x.dtype)))]


neg_p.grad = lambda cts, i, o: [_neg(cts[0])]
abs_p.grad = _abs_grad
for _p in (sign_p, floor_p, ceil_p, round_p, trunc_p):
    # Piecewise constant: zero almost everywhere.
    _p.grad = _zero_rule
del _p
exp_p.grad = unary_grad(lambda x, y: y)
exp2_p.grad = unary_grad(lambda x, y: _mul(y, _c(np.log(2.0), y)))
expm1_p.grad = unary_grad(lambda x, y: _add(y, _c(1, y)))
log_p.grad = unary_grad(lambda x, y: reciprocal_p.bind(x))
log1p_p.grad = unary_grad(lambda x, y: reciprocal_p.bind(_add(x, _c(1, x))))
log2_p.grad = unary_grad(
    lambda x, y: reciprocal_p.bind(_mul(x, _c(np.log(2.0), x))))
log10_p.grad = unary_grad(
    lambda x, y: reciprocal_p.bind(_mul(x, _c(np.log(10.0), x))))
sqrt_p.grad = unary_grad(lambda x, y: _div(_c(0.5, y), y))
rsqrt_p.grad = unary_grad(lambda x, y: _mul(_c(-0.5, y), _div(y, x)))
cbrt_p.grad = unary_grad(
    lambda x, y: reciprocal_p.bind(_mul(_c(3, y), _square(y))))
reciprocal_p.grad = unary_grad(lambda x, y: _neg(_square(y)))
square_p.grad = unary_grad(lambda x, y: _mul(_c(2, x), x))
sin_p.grad = unary_grad(lambda x, y: cos_p.bind(x))
cos_p.grad = unary_grad(lambda x, y: _neg(sin_p.bind(x)))
tan_p.grad = unary_grad(lambda x, y: _add(_c(1, y), _square(y)))
asin_p.grad = unary_grad(
    lambda x, y: rsqrt_p.bind(_sub(_c(1, x), _square(x))))
acos_p.grad = unary_grad(
    lambda x, y: _neg(rsqrt_p.bind(_sub(_c(1, x), _square(x)))))
atan_p.grad = unary_grad(
    lambda x, y: reciprocal_p.bind(_add(_c(1, x), _square(x))))
sinh_p.grad = unary_grad(lambda x, y: cosh_p.bind(x))
cosh_p.grad = unary_grad(lambda x, y: sinh_p.bind(x))
tanh_p.grad = unary_grad(lambda x, y: _sub(_c(1, y), _square(y)))
asinh_p.grad = unary_grad(
    lambda x, y: rsqrt_p.bind(_add(_square(x), _c(1, x))))
acosh_p.grad = unary_grad(
    lambda x, y: rsqrt_p.bind(_mul(_sub(x, _c(1, x)), _add(x, _c(1, x)))))
atanh_p.grad = unary_grad(
    lambda x, y: reciprocal_p.bind(_sub(_c(1, x), _square(x))))
logistic_p.grad = unary_grad(lambda x, y: _mul(y, _sub(_c(1, y), y)))
conj_p.grad = lambda cts, i, o: [conj_p.bind(cts[0])]
real_p.grad = _real_grad
imag_p.grad = _imag_grad
angle_p.grad = _angle_grad


def _binary_grad(dx, dy):
    """Rule for z = f(x, y): x_ct = g * dx(x, y, z), y_ct = g * dy(...),
    each summed back to its operand's shape."""

    def rule(cts, inputs, outputs, **params):
        (g,), (x, y), (z,) = cts, inputs, outputs
        return [
            None if dx is None
            else ad_util.unbroadcast(_mul(g, dx(x, y, z)), x.shape),
            None if dy is None
            else ad_util.unbroadcast(_mul(g, dy(x, y, z)), y.shape),
        ]

    return rule


def _add_grad(cts, inputs, outputs):
    (g,), (x, y) = cts, inputs
    return [ad_util.unbroadcast(g, x.shape), ad_util.unbroadcast(g, y.shape)]


def _sub_grad(cts, inputs, outputs):
    (g,), (x, y) = cts, inputs
    return [ad_util.unbroadcast(g, x.shape),
            ad_util.unbroadcast(_neg(g), y.shape)]


def _safe_log(x):
    # log(x) where x != 0; the term it multiplies is zero there.
    is_zero = eq_p.bind(x, _c(0, x))
    return log_p.bind(select_p.bind(is_zero, _c(1, x), x))


def _pow_dx(x, y, z):
    y_zero = eq_p.bind(y, _c(0, y))
    deriv = _mul(y, pow_p.bind(x, _sub(y, _c(1, y))))
    return select_p.bind(y_zero, _c(0, deriv), deriv)


def _minmax_grad(strict):
    def rule(cts, inputs, outputs):
        (g,), (x, y) = cts, inputs
        one, half = _c(1, g), _c(0.5, g)
        x_wins = strict.bind(x, y)
        tie = eq_p.bind(x, y)
        zero = _c(0, g)
        share_x = select_p.bind(x_wins, one, select_p.bind(tie, half, zero))
        share_y = select_p.bind(x_wins, zero, select_p.bind(tie, half, one))
        return [ad_util.unbroadcast(_mul(g, share_x), x.shape),
                ad_util.unbroadcast(_mul(g, share_y), y.shape)]

    return rule


def _copysign_dx(x, y, z):
    same = eq_p.bind(signbit_p.bind(x), signbit_p.bind(y))
    return select_p.bind(same, _c(1, x), _c(-1, x))


add_p.grad = _add_grad
sub_p.grad = _sub_grad
mul_p.grad = _binary_grad(lambda x, y, z: y, lambda x, y, z: x)
div_p.grad = _binary_grad(
    lambda x, y, z: reciprocal_p.bind(y), lambda x, y, z: _neg(_div(z, y)))
floor_div_p.grad = _zero_rule
rem_p.grad = _binary_grad(
    lambda x, y, z: _c(1, x),
    lambda x, y, z: _neg(trunc_p.bind(_div(x, y))))
mod_p.grad = _binary_grad(
    lambda x, y, z: _c(1, x),
    lambda x, y, z: _neg(floor_p.bind(_div(x, y))))
pow_p.grad = _binary_grad(_pow_dx, lambda x, y, z: _mul(z, _safe_log(x)))
max_p.grad = _minmax_grad(gt_p)
min_p.grad = _minmax_grad(lt_p)
atan2_p.grad = _binary_grad(
    lambda x, y, z: _div(y, _add(_square(x), _square(y))),
    lambda x, y, z: _neg(_div(x, _add(_square(x), _square(y)))))
hypot_p.grad = _binary_grad(
    lambda x, y, z: _div(x, z), lambda x, y, z: _div(y, z))
copysign_p.grad = _binary_grad(_copysign_dx, None)
logaddexp_p.grad = _binary_grad(
    lambda x, y, z: exp_p.bind(_sub(x, z)),
    lambda x, y, z: exp_p.bind(_sub(y, z)))
logaddexp2_p.grad = _binary_grad(
    lambda x, y, z: exp2_p.bind(_sub(x, z)),
    lambda x, y, z: exp2_p.bind(_sub(y, z)))


def _select_grad(cts, inputs, outputs):
    (g,), (pred, on_true, on_false) = cts, inputs
    zero = _c(0, g)
    return [
        None,
        ad_util.unbroadcast(select_p.bind(pred, g, zero), on_true.shape),
        ad_util.unbroadcast(select_p.bind(pred, zero, g), on_false.shape),
    ]


def _clamp_grad(cts, inputs, outputs):
    (g,), (lo, x, hi) = cts, inputs
    zero = _c(0, g)
    below = lt_p.bind(x, lo)
    above = gt_p.bind(x, hi)
    inside = logical_not_p.bind(or_p.bind(below, above))
    return [
        ad_util.unbroadcast(select_p.bind(below, g, zero), lo.shape),
        ad_util.unbroadcast(select_p.bind(inside, g, zero), x.shape),
        ad_util.unbroadcast(select_p.bind(above, g, zero), hi.shape),
    ]


select_p.grad = _select_grad
clamp_p.grad = _clamp_grad


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


# -- cost rules (formulas and constants: keras_ipu/device/simulator/cost_model.py)
from keras_ipu.device.primitives import cost_util as _cost  # noqa: E402

# Transcendentals are sequences of vector ops; the rest is one op per element.
_TRANSCENDENTAL = {
    "exp", "exp2", "expm1", "log", "log1p", "log2", "log10", "sqrt", "rsqrt",
    "cbrt", "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh",
    "tanh", "asinh", "acosh", "atanh", "logistic", "angle", "pow", "atan2",
    "hypot", "logaddexp", "logaddexp2", "gcd", "lcm", "nextafter",
}
for _p in [v for k, v in globals().items() if k.endswith("_p") and isinstance(v, Primitive)]:
    _p.cost = _cost.transcendental if _p.name in _TRANSCENDENTAL else _cost.elementwise(1)
del _p
