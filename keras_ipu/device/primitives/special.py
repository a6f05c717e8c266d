"""Special functions (error function, gamma family, Bessel) as primitives.

Their kernels are SciPy's ufuncs. SciPy is imported when a kernel first
runs, not when the primitive set is registered: `import keras_ipu` stays
light. SciPy has no bfloat16/float16 loops, so those compute in float32 and
round once at the end (which is also what the IPU's half-precision
transcendental units do).
"""

import numpy as np

from keras_ipu.device.primitives import ad_util
from keras_ipu.device.primitives import elementwise as ew
from keras_ipu.device.primitives import shape_rules
from keras_ipu.device.primitives.elementwise import exact_kernel
from keras_ipu.device.primitives.registry import Primitive


def _scipy(name):
    def fn(*xs):
        from scipy import special  # lazy: only when the kernel first runs

        if xs[0].dtype.itemsize < 4 and xs[0].dtype.kind == "f":
            xs = [x.astype(np.float32) for x in xs]
        return getattr(special, name)(*xs)

    fn.__name__ = name
    return fn


def _special(name, scipy_name, nondiff=None):
    rule = shape_rules.elementwise()
    return Primitive(
        name, rule, exact_kernel(rule, _scipy(scipy_name)), nondiff=nondiff
    )


erf_p = _special("erf", "erf")
erfc_p = _special("erfc", "erfc")
erfinv_p = _special("erfinv", "erfinv")
lgamma_p = _special("lgamma", "gammaln")
digamma_p = _special("digamma", "digamma")
# Modified Bessel functions of the first kind (and exponentially scaled).
i0_p = _special("i0", "i0")
i0e_p = _special("i0e", "i0e")
i1_p = _special("i1", "i1")
i1e_p = _special("i1e", "i1e")
# Regularized incomplete gamma functions P(a, x) and Q(a, x).
igamma_p = _special("igamma", "gammainc")
igammac_p = _special("igammac", "gammaincc")
# Regularized incomplete beta function I_x(a, b): operands (a, b, x).
betainc_p = _special("betainc", "betainc")


# -- gradient rules (contract: keras_ipu/device/autodiff.py) -----------------
# igamma, igammac and betainc: in special_grads.py (imported at the end), with
# the primitives that differentiate them in their shape parameters.

_TWO_OVER_SQRT_PI = 2.0 / np.sqrt(np.pi)


def _c(value, like):
    return ad_util.scalar(value, like.dtype)


def _mul(a, b):
    return ew.mul_p.bind(a, b)


def _div(a, b):
    return ew.div_p.bind(a, b)


def _add(a, b):
    return ew.add_p.bind(a, b)


def _sub(a, b):
    return ew.sub_p.bind(a, b)


def _neg(a):
    return ew.neg_p.bind(a)


def _square(a):
    return ew.mul_p.bind(a, a)


def _nonzero_x(x):
    is_zero = ew.eq_p.bind(x, _c(0, x))
    return is_zero, ew.select_p.bind(is_zero, _c(1, x), x)


def _i1_deriv(x, y):
    # i1'(x) = i0(x) - i1(x) / x, and 1/2 at x = 0.
    is_zero, safe = _nonzero_x(x)
    d = _sub(i0_p.bind(x), _div(y, safe))
    return ew.select_p.bind(is_zero, _c(0.5, x), d)


def _i1e_deriv(x, y):
    # i1e'(x) = i0e(x) - i1e(x) (sign(x) + 1/x), and 1/2 at x = 0.
    is_zero, safe = _nonzero_x(x)
    d = _sub(
        i0e_p.bind(x),
        _mul(y, _add(ew.sign_p.bind(x), ew.reciprocal_p.bind(safe))),
    )
    return ew.select_p.bind(is_zero, _c(0.5, x), d)


def _trigamma(x):
    """psi'(x) from primitives: six steps of psi'(x) = psi'(x + 1) + 1/x^2,
    then the asymptotic series at x + 6 (error < 1e-12 there); x < 1/2 by
    the reflection psi'(1 - x) + psi'(x) = pi^2 / sin^2(pi x)."""

    def positive(z):
        total = None
        for k in range(6):
            zk = _add(z, _c(k, z))
            total = ad_util.add_any(total, ew.reciprocal_p.bind(_square(zk)))
        w = _add(z, _c(6, z))
        inv = ew.reciprocal_p.bind(w)
        inv2 = _square(inv)
        # 1/w + 1/(2w^2) + 1/(6w^3) - 1/(30w^5) + 1/(42w^7) - 1/(30w^9)
        series = _c(-1.0 / 30, w)
        for coef in (1.0 / 42, -1.0 / 30, 1.0 / 6):
            series = _add(_mul(series, inv2), _c(coef, w))
        series = _mul(series, _mul(inv2, inv))
        series = _add(series, _add(inv, _mul(_c(0.5, w), inv2)))
        return _add(total, series)

    small = ew.lt_p.bind(x, _c(0.5, x))
    safe_x = ew.select_p.bind(small, _sub(_c(1, x), x), x)
    direct = positive(safe_x)
    s = ew.sin_p.bind(_mul(_c(np.pi, x), x))
    reflected = _sub(_div(_c(np.pi ** 2, x), _square(s)), direct)
    return ew.select_p.bind(small, reflected, direct)


erf_p.grad = ew.unary_grad(
    lambda x, y: _mul(_c(_TWO_OVER_SQRT_PI, x),
                      ew.exp_p.bind(_neg(_square(x)))))
erfc_p.grad = ew.unary_grad(
    lambda x, y: _mul(_c(-_TWO_OVER_SQRT_PI, x),
                      ew.exp_p.bind(_neg(_square(x)))))
erfinv_p.grad = ew.unary_grad(
    lambda x, y: _mul(_c(np.sqrt(np.pi) / 2, y), ew.exp_p.bind(_square(y))))
lgamma_p.grad = ew.unary_grad(lambda x, y: digamma_p.bind(x))
digamma_p.grad = ew.unary_grad(lambda x, y: _trigamma(x))
i0_p.grad = ew.unary_grad(lambda x, y: i1_p.bind(x))
i0e_p.grad = ew.unary_grad(
    lambda x, y: _sub(i1e_p.bind(x), _mul(ew.sign_p.bind(x), y)))
i1_p.grad = ew.unary_grad(_i1_deriv)
i1e_p.grad = ew.unary_grad(_i1e_deriv)


# -- cost rules (formulas and constants: keras_ipu/device/simulator/cost_model.py)
from keras_ipu.device.primitives import cost_util as _cost  # noqa: E402

for _p in (erf_p, erfc_p, erfinv_p, lgamma_p, digamma_p, i0_p, i0e_p, i1_p,
           i1e_p, igamma_p, igammac_p, betainc_p):
    _p.cost = _cost.transcendental
del _p

# Rules of igamma, igammac, betainc (and their derivative primitives).
from keras_ipu.device.primitives import special_grads  # noqa: E402,F401
