"""Gradient rules of the primitives of primitives/elementwise.py (contract:
keras_ipu/device/autodiff/__init__.py), registered when the primitive set
is imported (primitives/__init__.py), after every primitive is declared."""

import numpy as np

from keras_ipu.device.primitives import ad_util
from keras_ipu.device.primitives import elementwise as ew
from keras_ipu.device.primitives.ad_util import add
from keras_ipu.device.primitives.ad_util import const
from keras_ipu.device.primitives.ad_util import div
from keras_ipu.device.primitives.ad_util import mul
from keras_ipu.device.primitives.ad_util import neg
from keras_ipu.device.primitives.ad_util import square
from keras_ipu.device.primitives.ad_util import sub


def unary_grad(derivative):
    """Rule for y = f(x): x_ct = g * derivative(x, y). special.py uses it
    too."""

    def rule(cts, inputs, outputs, **params):
        (g,), (x,), (y,) = cts, inputs, outputs
        return [mul(g, derivative(x, y))]

    return rule


def _zero_rule(cts, inputs, outputs, **params):
    return [None] * len(inputs)


def _abs_grad(cts, inputs, outputs):
    (g,), (x,), (y,) = cts, inputs, outputs
    if x.dtype.kind != "c":
        return [mul(g, ew.sign_p.bind(x))]
    # d|z| = Re(conj(z) dz) / |z|: the cotangent is g conj(z) / |z| (zero
    # at z = 0).
    is_zero = ew.eq_p.bind(y, const(0, y))
    scale = div(g, ew.select_p.bind(is_zero, const(1, y), y))
    scale = ew.select_p.bind(is_zero, const(0, scale), scale)
    return [mul(ad_util.convert(scale, x.dtype), ew.conj_p.bind(x))]


def _real_grad(cts, inputs, outputs):
    (g,), (x,) = cts, inputs
    return [ad_util.convert(g, x.dtype)]


def _imag_grad(cts, inputs, outputs):
    (g,), (x,) = cts, inputs
    if x.dtype.kind != "c":
        return [None]
    # imag(x) = Re(-i x): the transpose maps g to -i g.
    return [mul(ad_util.convert(g, x.dtype), ad_util.scalar(-1j, x.dtype))]


def _angle_grad(cts, inputs, outputs):
    (g,), (x,) = cts, inputs
    if x.dtype.kind != "c":
        return [None]  # 0 or pi: piecewise constant on real numbers
    # d angle(z) = Im(dz / z) = Re(-i conj(z) dz) / |z|^2.
    sq = ew.real_p.bind(mul(x, ew.conj_p.bind(x)))
    scale = div(g, sq)
    return [mul(ad_util.convert(scale, x.dtype),
                 mul(ew.conj_p.bind(x), ad_util.scalar(-1j, x.dtype)))]


ew.neg_p.grad = lambda cts, i, o: [neg(cts[0])]
ew.abs_p.grad = _abs_grad
for _p in (ew.sign_p, ew.floor_p, ew.ceil_p, ew.round_p, ew.trunc_p):
    # Piecewise constant: zero almost everywhere.
    _p.grad = _zero_rule
del _p
ew.exp_p.grad = unary_grad(lambda x, y: y)
ew.exp2_p.grad = unary_grad(lambda x, y: mul(y, const(np.log(2.0), y)))
ew.expm1_p.grad = unary_grad(lambda x, y: add(y, const(1, y)))
ew.log_p.grad = unary_grad(lambda x, y: ew.reciprocal_p.bind(x))
ew.log1p_p.grad = unary_grad(lambda x, y: ew.reciprocal_p.bind(add(x, const(1, x))))
ew.log2_p.grad = unary_grad(
    lambda x, y: ew.reciprocal_p.bind(mul(x, const(np.log(2.0), x))))
ew.log10_p.grad = unary_grad(
    lambda x, y: ew.reciprocal_p.bind(mul(x, const(np.log(10.0), x))))
ew.sqrt_p.grad = unary_grad(lambda x, y: div(const(0.5, y), y))
ew.rsqrt_p.grad = unary_grad(lambda x, y: mul(const(-0.5, y), div(y, x)))
ew.cbrt_p.grad = unary_grad(
    lambda x, y: ew.reciprocal_p.bind(mul(const(3, y), square(y))))
ew.reciprocal_p.grad = unary_grad(lambda x, y: neg(square(y)))
ew.square_p.grad = unary_grad(lambda x, y: mul(const(2, x), x))
ew.sin_p.grad = unary_grad(lambda x, y: ew.cos_p.bind(x))
ew.cos_p.grad = unary_grad(lambda x, y: neg(ew.sin_p.bind(x)))
ew.tan_p.grad = unary_grad(lambda x, y: add(const(1, y), square(y)))
ew.asin_p.grad = unary_grad(
    lambda x, y: ew.rsqrt_p.bind(sub(const(1, x), square(x))))
ew.acos_p.grad = unary_grad(
    lambda x, y: neg(ew.rsqrt_p.bind(sub(const(1, x), square(x)))))
ew.atan_p.grad = unary_grad(
    lambda x, y: ew.reciprocal_p.bind(add(const(1, x), square(x))))
ew.sinh_p.grad = unary_grad(lambda x, y: ew.cosh_p.bind(x))
ew.cosh_p.grad = unary_grad(lambda x, y: ew.sinh_p.bind(x))
ew.tanh_p.grad = unary_grad(lambda x, y: sub(const(1, y), square(y)))
ew.asinh_p.grad = unary_grad(
    lambda x, y: ew.rsqrt_p.bind(add(square(x), const(1, x))))
ew.acosh_p.grad = unary_grad(
    lambda x, y: ew.rsqrt_p.bind(mul(sub(x, const(1, x)), add(x, const(1, x)))))
ew.atanh_p.grad = unary_grad(
    lambda x, y: ew.reciprocal_p.bind(sub(const(1, x), square(x))))
ew.logistic_p.grad = unary_grad(lambda x, y: mul(y, sub(const(1, y), y)))
ew.conj_p.grad = lambda cts, i, o: [ew.conj_p.bind(cts[0])]
ew.real_p.grad = _real_grad
ew.imag_p.grad = _imag_grad
ew.angle_p.grad = _angle_grad


def _binary_grad(dx, dy):
    """Rule for z = f(x, y): x_ct = g * dx(x, y, z), y_ct = g * dy(...),
    each summed back to its operand's shape."""

    def rule(cts, inputs, outputs, **params):
        (g,), (x, y), (z,) = cts, inputs, outputs
        return [
            None if dx is None
            else ad_util.unbroadcast(mul(g, dx(x, y, z)), x.shape),
            None if dy is None
            else ad_util.unbroadcast(mul(g, dy(x, y, z)), y.shape),
        ]

    return rule


def _add_grad(cts, inputs, outputs):
    (g,), (x, y) = cts, inputs
    return [ad_util.unbroadcast(g, x.shape), ad_util.unbroadcast(g, y.shape)]


def _sub_grad(cts, inputs, outputs):
    (g,), (x, y) = cts, inputs
    return [ad_util.unbroadcast(g, x.shape),
            ad_util.unbroadcast(neg(g), y.shape)]


def _safe_log(x):
    # log(x) where x != 0; the term it multiplies is zero there.
    is_zero = ew.eq_p.bind(x, const(0, x))
    return ew.log_p.bind(ew.select_p.bind(is_zero, const(1, x), x))


def _pow_dx(x, y, z):
    y_zero = ew.eq_p.bind(y, const(0, y))
    deriv = mul(y, ew.pow_p.bind(x, sub(y, const(1, y))))
    return ew.select_p.bind(y_zero, const(0, deriv), deriv)


def _minmax_grad(strict):
    def rule(cts, inputs, outputs):
        (g,), (x, y) = cts, inputs
        one, half = const(1, g), const(0.5, g)
        x_wins = strict.bind(x, y)
        tie = ew.eq_p.bind(x, y)
        zero = const(0, g)
        share_x = ew.select_p.bind(x_wins, one, ew.select_p.bind(tie, half, zero))
        share_y = ew.select_p.bind(x_wins, zero, ew.select_p.bind(tie, half, one))
        return [ad_util.unbroadcast(mul(g, share_x), x.shape),
                ad_util.unbroadcast(mul(g, share_y), y.shape)]

    return rule


def _copysign_dx(x, y, z):
    same = ew.eq_p.bind(ew.signbit_p.bind(x), ew.signbit_p.bind(y))
    return ew.select_p.bind(same, const(1, x), const(-1, x))


ew.add_p.grad = _add_grad
ew.sub_p.grad = _sub_grad
ew.mul_p.grad = _binary_grad(lambda x, y, z: y, lambda x, y, z: x)
ew.div_p.grad = _binary_grad(
    lambda x, y, z: ew.reciprocal_p.bind(y), lambda x, y, z: neg(div(z, y)))
ew.floor_div_p.grad = _zero_rule
ew.rem_p.grad = _binary_grad(
    lambda x, y, z: const(1, x),
    lambda x, y, z: neg(ew.trunc_p.bind(div(x, y))))
ew.mod_p.grad = _binary_grad(
    lambda x, y, z: const(1, x),
    lambda x, y, z: neg(ew.floor_p.bind(div(x, y))))
ew.pow_p.grad = _binary_grad(_pow_dx, lambda x, y, z: mul(z, _safe_log(x)))
ew.max_p.grad = _minmax_grad(ew.gt_p)
ew.min_p.grad = _minmax_grad(ew.lt_p)
ew.atan2_p.grad = _binary_grad(
    lambda x, y, z: div(y, add(square(x), square(y))),
    lambda x, y, z: neg(div(x, add(square(x), square(y)))))
ew.hypot_p.grad = _binary_grad(
    lambda x, y, z: div(x, z), lambda x, y, z: div(y, z))
ew.copysign_p.grad = _binary_grad(_copysign_dx, None)
ew.logaddexp_p.grad = _binary_grad(
    lambda x, y, z: ew.exp_p.bind(sub(x, z)),
    lambda x, y, z: ew.exp_p.bind(sub(y, z)))
ew.logaddexp2_p.grad = _binary_grad(
    lambda x, y, z: ew.exp2_p.bind(sub(x, z)),
    lambda x, y, z: ew.exp2_p.bind(sub(y, z)))


def _select_grad(cts, inputs, outputs):
    (g,), (pred, on_true, on_false) = cts, inputs
    zero = const(0, g)
    return [
        None,
        ad_util.unbroadcast(ew.select_p.bind(pred, g, zero), on_true.shape),
        ad_util.unbroadcast(ew.select_p.bind(pred, zero, g), on_false.shape),
    ]


def _clamp_grad(cts, inputs, outputs):
    (g,), (lo, x, hi) = cts, inputs
    zero = const(0, g)
    below = ew.lt_p.bind(x, lo)
    above = ew.gt_p.bind(x, hi)
    inside = ew.logical_not_p.bind(ew.or_p.bind(below, above))
    return [
        ad_util.unbroadcast(ew.select_p.bind(below, g, zero), lo.shape),
        ad_util.unbroadcast(ew.select_p.bind(inside, g, zero), x.shape),
        ad_util.unbroadcast(ew.select_p.bind(above, g, zero), hi.shape),
    ]


ew.select_p.grad = _select_grad
ew.clamp_p.grad = _clamp_grad
