"""Gradient rules of the special functions (primitives/special.py). The
derivatives in x are closed forms (the integrands of igamma and betainc);
those in the shape parameters are primitives of their own
(primitives/special_derivatives.py)."""

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
from keras_ipu.device.primitives.grads.elementwise import unary_grad
from keras_ipu.device.primitives.special import betainc_p
from keras_ipu.device.primitives.special import digamma_p
from keras_ipu.device.primitives.special import erf_p
from keras_ipu.device.primitives.special import erfc_p
from keras_ipu.device.primitives.special import erfinv_p
from keras_ipu.device.primitives.special import i0_p
from keras_ipu.device.primitives.special import i0e_p
from keras_ipu.device.primitives.special import i1_p
from keras_ipu.device.primitives.special import i1e_p
from keras_ipu.device.primitives.special import igamma_p
from keras_ipu.device.primitives.special import igammac_p
from keras_ipu.device.primitives.special import lgamma_p
from keras_ipu.device.primitives.special_derivatives import betainc_grad_ab_p
from keras_ipu.device.primitives.special_derivatives import igamma_grad_a_p


_TWO_OVER_SQRT_PI = 2.0 / np.sqrt(np.pi)


def _nonzero_x(x):
    is_zero = ew.eq_p.bind(x, const(0, x))
    return is_zero, ew.select_p.bind(is_zero, const(1, x), x)


def _i1_deriv(x, y):
    # i1'(x) = i0(x) - i1(x) / x, and 1/2 at x = 0.
    is_zero, safe = _nonzero_x(x)
    d = sub(i0_p.bind(x), div(y, safe))
    return ew.select_p.bind(is_zero, const(0.5, x), d)


def _i1e_deriv(x, y):
    # i1e'(x) = i0e(x) - i1e(x) (sign(x) + 1/x), and 1/2 at x = 0.
    is_zero, safe = _nonzero_x(x)
    d = sub(
        i0e_p.bind(x),
        mul(y, add(ew.sign_p.bind(x), ew.reciprocal_p.bind(safe))),
    )
    return ew.select_p.bind(is_zero, const(0.5, x), d)


def trigamma(x):
    """psi'(x) from primitives: six steps of psi'(x) = psi'(x + 1) + 1/x^2,
    then the asymptotic series at x + 6 (error < 1e-12 there); x < 1/2 by
    the reflection psi'(1 - x) + psi'(x) = pi^2 / sin^2(pi x)."""

    def positive(z):
        total = None
        for k in range(6):
            zk = add(z, const(k, z))
            total = ad_util.add_any(total, ew.reciprocal_p.bind(square(zk)))
        w = add(z, const(6, z))
        inv = ew.reciprocal_p.bind(w)
        inv2 = square(inv)
        # 1/w + 1/(2w^2) + 1/(6w^3) - 1/(30w^5) + 1/(42w^7) - 1/(30w^9)
        series = const(-1.0 / 30, w)
        for coef in (1.0 / 42, -1.0 / 30, 1.0 / 6):
            series = add(mul(series, inv2), const(coef, w))
        series = mul(series, mul(inv2, inv))
        series = add(series, add(inv, mul(const(0.5, w), inv2)))
        return add(total, series)

    small = ew.lt_p.bind(x, const(0.5, x))
    safe_x = ew.select_p.bind(small, sub(const(1, x), x), x)
    direct = positive(safe_x)
    s = ew.sin_p.bind(mul(const(np.pi, x), x))
    reflected = sub(div(const(np.pi ** 2, x), square(s)), direct)
    return ew.select_p.bind(small, reflected, direct)


erf_p.grad = unary_grad(
    lambda x, y: mul(const(_TWO_OVER_SQRT_PI, x),
                      ew.exp_p.bind(neg(square(x)))))
erfc_p.grad = unary_grad(
    lambda x, y: mul(const(-_TWO_OVER_SQRT_PI, x),
                      ew.exp_p.bind(neg(square(x)))))
erfinv_p.grad = unary_grad(
    lambda x, y: mul(const(np.sqrt(np.pi) / 2, y), ew.exp_p.bind(square(y))))
lgamma_p.grad = unary_grad(lambda x, y: digamma_p.bind(x))
digamma_p.grad = unary_grad(lambda x, y: trigamma(x))
i0_p.grad = unary_grad(lambda x, y: i1_p.bind(x))
i0e_p.grad = unary_grad(
    lambda x, y: sub(i1e_p.bind(x), mul(ew.sign_p.bind(x), y)))
i1_p.grad = unary_grad(_i1_deriv)
i1e_p.grad = unary_grad(_i1e_deriv)


def _xlogy(coef, y, log_y):
    """coef * log_y, zero where coef is zero (0 log 0 = 0: the integrand at
    x = 0 for a = 1 is finite)."""
    prod = ew.mul_p.bind(coef, log_y)
    return ew.select_p.bind(ew.eq_p.bind(coef, const(0, coef)), const(0, prod), prod)


def _gamma_density(a, x):
    """x^(a-1) e^-x / Gamma(a), in log space so it neither over- nor
    underflows before the end."""
    log_d = ew.sub_p.bind(
        ew.sub_p.bind(_xlogy(ew.sub_p.bind(a, const(1, a)), x, ew.log_p.bind(x)),
                      x),
        lgamma_p.bind(a))
    return ew.exp_p.bind(log_d)


def _beta_density(a, b, x):
    """x^(a-1) (1-x)^(b-1) / B(a, b), in log space."""
    lg = lgamma_p.bind
    log_beta = ew.sub_p.bind(ew.add_p.bind(lg(a), lg(b)),
                             lg(ew.add_p.bind(a, b)))
    log_d = ew.add_p.bind(
        _xlogy(ew.sub_p.bind(a, const(1, a)), x, ew.log_p.bind(x)),
        _xlogy(ew.sub_p.bind(b, const(1, b)), x,
               ew.log1p_p.bind(ew.neg_p.bind(x))))
    return ew.exp_p.bind(ew.sub_p.bind(log_d, log_beta))


def _igamma_rule(sign):
    def rule(cts, inputs, outputs):
        (g,), (a, x) = cts, inputs
        if sign < 0:
            g = ew.neg_p.bind(g)
        return [
            ad_util.unbroadcast(
                ew.mul_p.bind(g, igamma_grad_a_p.bind(a, x)), a.shape),
            ad_util.unbroadcast(
                ew.mul_p.bind(g, _gamma_density(a, x)), x.shape),
        ]

    return rule


def _betainc_grad(cts, inputs, outputs):
    (g,), (a, b, x) = cts, inputs
    da, db = betainc_grad_ab_p.bind(a, b, x)
    return [
        ad_util.unbroadcast(ew.mul_p.bind(g, da), a.shape),
        ad_util.unbroadcast(ew.mul_p.bind(g, db), b.shape),
        ad_util.unbroadcast(ew.mul_p.bind(g, _beta_density(a, b, x)), x.shape),
    ]


igamma_p.grad = _igamma_rule(+1)
igammac_p.grad = _igamma_rule(-1)
betainc_p.grad = _betainc_grad
