"""Elementwise HLO opcodes (XLA operation semantics: element-wise unary and
binary ops, compare, select, clamp, convert, bitcast-convert).

Where XLA and NumPy differ, the rule composes primitives to XLA's meaning:
integer division and remainder truncate toward zero, shift-right-logical
fills with zeros on
signed integers, TOTALORDER comparisons order -NaN < -inf < -0 < +0 < inf <
NaN. (Opcodes TensorFlow does not emit, such as cbrt, count-leading-zeros or
round-nearest-afz, have no rule: the importer names them if they appear.)
"""

import numpy as np

from keras_ipu.device.primitives import convert as cv
from keras_ipu.device.primitives import elementwise as ew
from keras_ipu.device.primitives import special
from keras_ipu.frontends.tensorflow import hlo_proto
from keras_ipu.frontends.tensorflow.importer import HloImportError
from keras_ipu.frontends.tensorflow.importer import dtype_of
from keras_ipu.frontends.tensorflow.importer import rule

_UNARY = {
    "abs": ew.abs_p, "negate": ew.neg_p, "sign": ew.sign_p,
    "floor": ew.floor_p, "ceil": ew.ceil_p, "round-nearest-even": ew.round_p,
    "exponential": ew.exp_p, "exponential-minus-one": ew.expm1_p,
    "log": ew.log_p, "log-plus-one": ew.log1p_p, "sqrt": ew.sqrt_p,
    "rsqrt": ew.rsqrt_p, "sine": ew.sin_p,
    "cosine": ew.cos_p, "tan": ew.tan_p, "tanh": ew.tanh_p,
    "logistic": ew.logistic_p, "is-finite": ew.isfinite_p,
    "real": ew.real_p, "imag": ew.imag_p,
    "erf": special.erf_p,
}

_BINARY = {
    "add": ew.add_p, "subtract": ew.sub_p, "multiply": ew.mul_p,
    "maximum": ew.max_p, "minimum": ew.min_p, "power": ew.pow_p,
    "atan2": ew.atan2_p, "and": ew.and_p, "or": ew.or_p, "xor": ew.xor_p,
    "shift-left": ew.shift_left_p, "shift-right-arithmetic": ew.shift_right_p,
}

_COMPARE = {"EQ": ew.eq_p, "NE": ew.ne_p, "LT": ew.lt_p, "LE": ew.le_p,
            "GT": ew.gt_p, "GE": ew.ge_p}


def _out_dtype(instr):
    return hlo_proto.dtype_of(instr.shape.element_type)


@rule(*_UNARY)
def _unary(imp, instr, operands):
    (x,) = operands
    return imp.elementwise(_UNARY[instr.opcode], instr, x)


@rule(*_BINARY)
def _binary(imp, instr, operands):
    x, y = operands
    return imp.elementwise(_BINARY[instr.opcode], instr, x, y)


@rule("popcnt")
def _popcnt(imp, instr, operands):
    """Set bits of the two's-complement word (NumPy's bitwise_count counts
    the bits of |x| for signed integers)."""
    (x,) = operands
    dtype = dtype_of(x)
    if dtype.kind != "i":
        return imp.elementwise(ew.popcount_p, instr, x)
    unsigned = np.dtype(f"u{dtype.itemsize}")
    bits = imp.bind(ew.popcount_p, imp.bind(cv.bitcast_convert_type_p, imp.raw(x), dtype=unsigned))
    return imp.elementwise(cv.convert_element_type_p, instr, bits, dtype=dtype)


@rule("not")
def _not(imp, instr, operands):
    (x,) = operands
    prim = ew.logical_not_p if dtype_of(x) == np.bool_ else ew.not_p
    return imp.elementwise(prim, instr, x)


@rule("divide")
def _divide(imp, instr, operands):
    x, y = operands
    if dtype_of(x).kind in "iu":
        return _int_divide(imp, instr, x, y)
    return imp.elementwise(ew.div_p, instr, x, y)


def _int_divide(imp, instr, x, y):
    """C integer division (toward zero): floor division corrected by one
    where the remainder is non-zero and the signs differ; x / 0 is -1 for
    signed integers and all ones for unsigned, as XLA defines it."""
    dtype = dtype_of(x)
    zero = imp.constant(0, dtype)
    one = imp.constant(1, dtype)
    is_zero = imp.bind(ew.eq_p, y, zero)
    safe_y = imp.bind(ew.select_p, is_zero, one, y)
    q = imp.bind(ew.floor_div_p, x, safe_y)
    if dtype.kind == "i":
        r = imp.bind(ew.rem_p, x, safe_y)
        inexact = imp.bind(ew.ne_p, r, zero)
        signs = imp.bind(ew.ne_p, imp.bind(ew.lt_p, x, zero), imp.bind(ew.lt_p, safe_y, zero))
        fix = imp.bind(ew.and_p, inexact, signs)
        q = imp.bind(ew.select_p, fix, imp.bind(ew.add_p, q, one), q)
    all_ones = imp.constant(-1 if dtype.kind == "i" else np.iinfo(dtype).max, dtype)
    return imp.elementwise(ew.select_p, instr, is_zero, all_ones, q)


@rule("remainder")
def _remainder(imp, instr, operands):
    x, y = operands
    if dtype_of(x).kind in "iu":
        # C's %: the sign of the dividend; x % 0 is x (XLA).
        dtype = dtype_of(x)
        zero = imp.constant(0, dtype)
        is_zero = imp.bind(ew.eq_p, y, zero)
        safe_y = imp.bind(ew.select_p, is_zero, imp.constant(1, dtype), y)
        r = imp.bind(ew.rem_p, x, safe_y)
        return imp.elementwise(ew.select_p, instr, is_zero, x, r)
    return imp.elementwise(ew.rem_p, instr, x, y)


@rule("shift-right-logical")
def _shift_right_logical(imp, instr, operands):
    x, y = operands
    dtype = dtype_of(x)
    if dtype.kind == "u":
        return imp.elementwise(ew.shift_right_p, instr, x, y)
    unsigned = np.dtype(f"u{dtype.itemsize}")
    ux = imp.bind(cv.bitcast_convert_type_p, imp.raw(x), dtype=unsigned)
    uy = imp.bind(cv.bitcast_convert_type_p, imp.raw(y), dtype=unsigned)
    out = imp.bind(ew.shift_right_p, ux, uy)
    return imp.elementwise(cv.bitcast_convert_type_p, instr, out, dtype=dtype)


def _total_order_key(imp, x):
    """Signed integers that order floats as TOTALORDER does."""
    dtype = dtype_of(x)
    signed = np.dtype(f"i{dtype.itemsize}")
    i = imp.bind(cv.bitcast_convert_type_p, imp.raw(x), dtype=signed)
    bits = dtype.itemsize * 8
    sign = imp.bind(ew.shift_right_p, i, imp.constant(bits - 1, signed))  # 0 or -1
    magnitude = imp.constant(np.iinfo(signed).max, signed)
    return imp.bind(ew.xor_p, i, imp.bind(ew.and_p, sign, magnitude))


@rule("compare")
def _compare(imp, instr, operands):
    x, y = operands
    direction = instr.comparison_direction
    if direction not in _COMPARE:
        raise HloImportError(f"comparison direction {direction!r} is not one of {sorted(_COMPARE)}.")
    kind = dtype_of(x).kind
    if instr.comparison_type == "TOTALORDER" and (kind == "f" or dtype_of(x).name == "bfloat16"):
        x, y = _total_order_key(imp, x), _total_order_key(imp, y)
    elif instr.comparison_type == "UNSIGNED" and kind == "i":
        unsigned = np.dtype(f"u{dtype_of(x).itemsize}")
        x = imp.bind(cv.bitcast_convert_type_p, imp.raw(x), dtype=unsigned)
        y = imp.bind(cv.bitcast_convert_type_p, imp.raw(y), dtype=unsigned)
    return imp.elementwise(_COMPARE[direction], instr, x, y)


@rule("select")
def _select(imp, instr, operands):
    pred, on_true, on_false = operands
    if isinstance(on_true, tuple):
        raise HloImportError("select of tuples is not supported (XLA removed it).")
    return imp.elementwise(ew.select_p, instr, pred, on_true, on_false)


@rule("clamp")
def _clamp(imp, instr, operands):
    lo, x, hi = operands
    return imp.elementwise(ew.clamp_p, instr, lo, x, hi)


def _conversion(convert):
    """The rule of a conversion `convert(imp, instr, x, dtype)`: an operand
    of the target dtype already is the result itself."""

    def import_rule(imp, instr, operands):
        (x,) = operands
        dtype = _out_dtype(instr)
        if dtype_of(x) == dtype:
            return x
        return convert(imp, instr, x, dtype)

    return import_rule


@rule("convert")
@_conversion
def _convert(imp, instr, x, dtype):
    if dtype_of(x).kind == "c" and dtype.kind != "c":
        x = imp.bind(ew.real_p, x)
        if dtype_of(x) == dtype:
            return x
    return imp.elementwise(cv.convert_element_type_p, instr, x, dtype=dtype)


@rule("bitcast-convert")
@_conversion
def _bitcast_convert(imp, instr, x, dtype):
    if dtype_of(x).itemsize == dtype.itemsize:
        return imp.elementwise(cv.bitcast_convert_type_p, instr, x, dtype=dtype)
    return imp.bind(cv.bitcast_convert_type_p, imp.array(x), dtype=dtype)


@rule("complex")
def _complex(imp, instr, operands):
    re, im = operands
    dtype = _out_dtype(instr)
    re_c = imp.bind(cv.convert_element_type_p, re, dtype=dtype)
    im_c = imp.bind(cv.convert_element_type_p, im, dtype=dtype)
    return imp.elementwise(ew.add_p, instr, re_c, imp.bind(ew.mul_p, im_c, imp.constant(1j, dtype)))


@rule("reduce-precision")
def _reduce_precision(imp, instr, operands):
    """Rounding to a narrower float format: to float16 or bfloat16 and back
    when the exponent/mantissa sizes are theirs."""
    (x,) = operands
    formats = {(5, 10): np.dtype(np.float16), (8, 23): np.dtype(np.float32),
               (11, 52): np.dtype(np.float64)}
    key = (instr.exponent_bits, instr.mantissa_bits)
    if key == (8, 7):
        narrow = hlo_proto.dtype_of(hlo_proto.protos()[1].BF16)
    elif key in formats:
        narrow = formats[key]
    else:
        raise HloImportError(
            f"reduce-precision to {instr.exponent_bits} exponent and "
            f"{instr.mantissa_bits} mantissa bits: only float16, bfloat16, "
            "float32 and float64 formats are supported."
        )
    dtype = dtype_of(x)
    if narrow == dtype or narrow.itemsize >= dtype.itemsize:
        return x
    down = imp.bind(cv.convert_element_type_p, x, dtype=narrow)
    return imp.elementwise(cv.convert_element_type_p, instr, down, dtype=dtype)
