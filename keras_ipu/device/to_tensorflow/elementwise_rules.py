"""TensorFlow rules of the elementwise primitives (primitives/elementwise.py,
special.py, convert.py). Operands share one dtype (the shape rule checks)
and broadcast as NumPy's; the rule returns the primitive's output dtype,
computing as its NumPy kernel does: bool arithmetic on uint8, float to
int conversion truncating and saturating, shifts by the width or more
giving 0 (or the sign)."""

import numpy as np
import tensorflow as tf

from keras_ipu.device.to_tensorflow.emitter import rule
from keras_ipu.device.to_tensorflow.emitter import tf_dtype


def _out(ctx, value):
    """`value` in the primitive's output dtype."""
    dtype = tf_dtype(ctx.out_aval.dtype)
    if value.dtype == dtype:
        return value
    if dtype == tf.bool:
        return tf.not_equal(value, tf.zeros((), value.dtype))
    return tf.cast(value, dtype)


def _bool_as_uint8(fn):
    """As the kernels' `_bool_arith`: NumPy computes bool arithmetic on
    uint8 and the result is cast back to bool (nonzero is True)."""

    def emit(ctx, *xs):
        if xs[0].dtype == tf.bool:
            xs = [tf.cast(x, tf.uint8) for x in xs]
        return _out(ctx, fn(*xs))

    return emit


_SIMPLE = {
    "add": tf.math.add,
    "sub": tf.math.subtract,
    "mul": tf.math.multiply,
    "max": tf.math.maximum,
    "min": tf.math.minimum,
    "neg": tf.math.negative,
    "square": tf.math.square,
    "floor_div": tf.math.floordiv,
    "mod": tf.math.floormod,
    "rem": tf.truncatemod,
}
for _name, _fn in _SIMPLE.items():
    rule(_name)(_bool_as_uint8(_fn))


def _direct(fn):
    """The rule of a primitive TensorFlow's `fn` computes as its kernel
    does, given the operands: `fn`'s result in the output dtype."""

    def emit(ctx, *xs):
        return _out(ctx, fn(*xs))

    return emit


_LN2 = float(np.log(2.0))
_LN10 = float(np.log(10.0))

_UNARY = {
    "abs": tf.math.abs,
    "floor": tf.math.floor,
    "ceil": tf.math.ceil,
    "round": tf.math.round,  # half to even, as np.round
    "trunc": lambda x: tf.where(x < 0, tf.math.ceil(x), tf.math.floor(x)),
    "exp": tf.math.exp,
    "exp2": lambda x: tf.math.exp(x * tf.constant(_LN2, x.dtype)),
    "expm1": tf.math.expm1,
    "log": tf.math.log,
    "log1p": tf.math.log1p,
    "log2": lambda x: tf.math.log(x) / tf.constant(_LN2, x.dtype),
    "log10": lambda x: tf.math.log(x) / tf.constant(_LN10, x.dtype),
    "sqrt": tf.math.sqrt,
    "rsqrt": tf.math.rsqrt,
    "cbrt": lambda x: tf.math.sign(x) * tf.math.pow(
        tf.math.abs(x), tf.constant(1.0 / 3.0, x.dtype)),
    "reciprocal": tf.math.reciprocal,
    "sin": tf.math.sin,
    "cos": tf.math.cos,
    "tan": tf.math.tan,
    "asin": tf.math.asin,
    "acos": tf.math.acos,
    "atan": tf.math.atan,
    "sinh": tf.math.sinh,
    "cosh": tf.math.cosh,
    "tanh": tf.math.tanh,
    "asinh": tf.math.asinh,
    "acosh": tf.math.acosh,
    "atanh": tf.math.atanh,
    "logistic": tf.math.sigmoid,
    "conj": tf.math.conj,
    "real": tf.math.real,
    "imag": tf.math.imag,
    "angle": tf.math.angle,
    "isnan": tf.math.is_nan,
    "isinf": tf.math.is_inf,
    "isfinite": tf.math.is_finite,
    "erf": tf.math.erf,
    "erfc": tf.math.erfc,
    "erfinv": tf.math.erfinv,
    "lgamma": tf.math.lgamma,
    "digamma": tf.math.digamma,
    "i0e": tf.math.special.bessel_i0e,
    "i1e": tf.math.special.bessel_i1e,
    "i0": lambda x: tf.math.special.bessel_i0e(x) * tf.math.exp(tf.math.abs(x)),
    "i1": lambda x: tf.math.special.bessel_i1e(x) * tf.math.exp(tf.math.abs(x)),
    "logical_not": lambda x: tf.math.logical_not(tf.cast(x, tf.bool)),
}
for _name, _fn in _UNARY.items():
    rule(_name)(_direct(_fn))


@rule("sign")
def _sign(ctx, x):
    if x.dtype == tf.bool:
        return x
    return tf.math.sign(x)


@rule("not")
def _not(ctx, x):
    if x.dtype == tf.bool:
        return tf.math.logical_not(x)
    return tf.bitwise.invert(x)


@rule("signbit")
def _signbit(ctx, x):
    if not x.dtype.is_floating:
        return tf.math.less(x, tf.zeros((), x.dtype))
    bits = {2: tf.int16, 4: tf.int32, 8: tf.int64}[x.dtype.size]
    return tf.math.less(tf.bitcast(x, bits), tf.zeros((), bits))


@rule("population_count")
def _popcount(ctx, x):
    return _out(ctx, tf.raw_ops.PopulationCount(x=x))


_BINARY = {
    "atan2": tf.math.atan2,
    "nextafter": tf.math.nextafter,
    "igamma": tf.math.igamma,
    "igammac": tf.math.igammac,
    "eq": tf.math.equal,
    "ne": tf.math.not_equal,
    "lt": tf.math.less,
    "le": tf.math.less_equal,
    "gt": tf.math.greater,
    "ge": tf.math.greater_equal,
}
for _name, _fn in _BINARY.items():
    rule(_name)(_direct(_fn))


@rule("div")
def _div(ctx, x, y):
    if x.dtype.is_floating or x.dtype.is_complex:
        return tf.math.divide(x, y)
    # np.true_divide then a cast back to the integer dtype: toward zero.
    return _out(ctx, tf.truncatediv(x, y))


@rule("pow")
def _pow(ctx, x, y):
    if x.dtype == tf.bool:
        return _out(ctx, tf.math.pow(tf.cast(x, tf.uint8), tf.cast(y, tf.uint8)))
    return tf.math.pow(x, y)


@rule("hypot")
def _hypot(ctx, x, y):
    # Scaled by the larger magnitude, as np.hypot, so it does not overflow.
    ax, ay = tf.math.abs(x), tf.math.abs(y)
    big, small = tf.math.maximum(ax, ay), tf.math.minimum(ax, ay)
    safe = tf.where(big > 0, big, tf.ones_like(big))
    ratio = small / safe
    out = big * tf.math.sqrt(1 + ratio * ratio)
    return tf.where(tf.math.is_inf(ax) | tf.math.is_inf(ay),
                    tf.fill(tf.shape(out), tf.constant(np.inf, out.dtype)), out)


@rule("copysign")
def _copysign(ctx, x, y):
    bits = {2: tf.int16, 4: tf.int32, 8: tf.int64}[x.dtype.size]
    sign = tf.bitwise.left_shift(tf.ones((), bits), tf.constant(8 * x.dtype.size - 1, bits))
    magnitude = tf.bitwise.bitwise_and(tf.bitcast(x, bits), tf.bitwise.invert(sign))
    sign_y = tf.bitwise.bitwise_and(tf.bitcast(y, bits), sign)
    magnitude, sign_y = tf.broadcast_to(magnitude, tf.shape(magnitude + sign_y)), tf.broadcast_to(
        sign_y, tf.shape(magnitude + sign_y))
    return tf.bitcast(tf.bitwise.bitwise_or(magnitude, sign_y), x.dtype)


def _logaddexp_base(ln_base):
    def emit(ctx, x, y):
        big = tf.math.maximum(x, y)
        delta = -tf.math.abs(x - y)
        if ln_base == 1.0:
            out = big + tf.math.log1p(tf.math.exp(delta))
        else:
            c = tf.constant(ln_base, x.dtype)
            out = big + tf.math.log1p(tf.math.exp(delta * c)) / c
        # Equal infinities (delta NaN): the infinity itself.
        return tf.where(tf.math.equal(x, y), x + tf.constant(np.log(2.0) / ln_base, x.dtype), out)

    return emit


rule("logaddexp")(_logaddexp_base(1.0))
rule("logaddexp2")(_logaddexp_base(_LN2))


def _bitwise(logical, bitwise):
    def emit(ctx, x, y):
        if x.dtype == tf.bool:
            return logical(x, y)
        return bitwise(x, y)

    return emit


rule("and")(_bitwise(tf.math.logical_and, tf.bitwise.bitwise_and))
rule("or")(_bitwise(tf.math.logical_or, tf.bitwise.bitwise_or))
rule("xor")(_bitwise(tf.math.logical_xor, tf.bitwise.bitwise_xor))


def _big_shift(x, y):
    bits = x.dtype.size * 8
    big = tf.math.logical_or(y < tf.zeros((), y.dtype), y >= tf.constant(bits, y.dtype))
    return big, tf.where(big, tf.zeros_like(y), y)


@rule("shift_left")
def _shift_left(ctx, x, y):
    big, y = _big_shift(x, y)
    return tf.where(big, tf.zeros((), x.dtype), tf.bitwise.left_shift(x, y))


@rule("shift_right")
def _shift_right(ctx, x, y):
    big, y = _big_shift(x, y)
    zero = tf.zeros((), x.dtype)
    fill = tf.where(x < zero, -tf.ones((), x.dtype), zero) if x.dtype.is_unsigned is False else zero
    return tf.where(big, fill, tf.bitwise.right_shift(x, y))


@rule("select")
def _select(ctx, pred, on_true, on_false):
    return tf.where(pred, on_true, on_false)


@rule("clamp")
def _clamp(ctx, lo, x, hi):
    return tf.math.minimum(tf.math.maximum(x, lo), hi)


@rule("convert_element_type")
def _convert(ctx, x, *, dtype):
    dtype = np.dtype(dtype)
    target = tf_dtype(dtype)
    if x.dtype == target:
        return x
    if x.dtype.is_complex and dtype.kind != "c":
        x = tf.math.real(x)
    if dtype.kind == "b":
        return tf.math.not_equal(x, tf.zeros((), x.dtype))
    if dtype.kind in "iu" and x.dtype.is_floating:
        # Truncate toward zero, NaN to 0, saturate: the kernel's rule (the
        # device's conversion), computed in float64 where every int32
        # bound is exact.
        info = np.iinfo(dtype)
        wide = tf.cast(x, tf.float64)
        wide = tf.where(tf.math.is_nan(wide), tf.zeros_like(wide), wide)
        wide = tf.clip_by_value(wide, float(info.min), float(info.max))
        wide = tf.where(wide < 0, tf.math.ceil(wide), tf.math.floor(wide))
        return tf.cast(wide, target)
    return tf.cast(x, target)


@rule("bitcast_convert_type")
def _bitcast(ctx, x, *, dtype, view=False):
    dtype = np.dtype(dtype)
    old, new = x.dtype.size, dtype.itemsize
    if old == new:
        return tf.bitcast(x, tf_dtype(dtype))
    if not view:
        return tf.bitcast(x, tf_dtype(dtype))  # lax's rule: adds/drops an axis
    # ndarray.view: the last axis is rescaled.
    shape = ctx.out_aval.shape
    if new < old:
        return tf.reshape(tf.bitcast(x, tf_dtype(dtype)), shape)
    ratio = new // old
    grouped = tf.reshape(x, tuple(ctx.in_avals[0].shape[:-1]) + (shape[-1], ratio))
    return tf.bitcast(grouped, tf_dtype(dtype))
