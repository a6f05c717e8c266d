"""Derivatives of the regularized incomplete gamma and beta functions in
their shape parameters.

Their derivatives in x are closed forms (the integrands, grads/special.py).
Those in the shape parameters (a; a and b) have none, so they are
primitives of their own, `igamma_grad_a` and `betainc_grad_ab`, whose
kernels evaluate the series / continued fractions that compute P(a, x) and
I_x(a, b) (Numerical Recipes, 3rd ed., 6.2 and 6.4) together with their
derivatives in forward mode, as Boik & Robison-Cox ("Derivatives of the
incomplete beta function", J. Stat. Software 3, 1998) do for the beta
function. The loops run over series terms, each step vectorised over all
elements, until every element has converged.
"""

import numpy as np

from keras_ipu.device.primitives import cost_util as _cost
from keras_ipu.device.primitives import shape_rules
from keras_ipu.device.primitives.registry import Primitive
from keras_ipu.device.simulator import cost_model as _cost_model

# Relative change below which a series / fraction has converged (a few
# ulps: the last bits of the recurrences wobble). A derivative is compared
# with the value too: what multiplies it in the end is of order one.
_EPS = 1e-14
# The series needs ~9 sqrt(a) terms where x is close to a: shape parameters
# up to ~3e7 are exact; beyond, the result is cut off (less accurate).
_MAX_TERMS = 50000
_TINY = 1e-300


def _f64(*xs):
    return [np.asarray(x, dtype=np.float64) for x in np.broadcast_arrays(*xs)]


class _Converging:
    """The elements of a vectorised iteration that have not converged yet:
    converged ones are stored and dropped, so a few slow elements do not
    keep the whole array iterating."""

    def __init__(self, size, outputs):
        self.live = np.arange(size)
        self.outs = [np.zeros(shape + (size,)) for shape in outputs]

    def retire(self, finished, values, arrays):
        """Store `values` (one per output) where `finished`; returns
        `arrays` (operands and state, element axis last) without them."""
        if not finished.any():
            return arrays
        for out, value in zip(self.outs, values):
            out[..., self.live[finished]] = value[..., finished]
        keep = ~finished
        self.live = self.live[keep]
        return [arr[..., keep] for arr in arrays]


def _continued_fraction(coef, params, n_params):
    """f = a1 / (b1 + a2 / (b2 + ...)) and its derivatives in `n_params`
    parameters, for 1-D operand arrays `params`. coef(n, *params) ->
    (a_n, b_n, da_n, db_n), da/db with the parameters on axis 0. Wallis'
    recurrences A_n = b_n A_{n-1} + a_n A_{n-2} (same for B), differentiated
    term by term and rescaled by B_n every step (B_n is then 1; the ratio
    and its derivative are unchanged by a common scale)."""
    size = params[0].shape[0]
    acc = _Converging(size, [(), (n_params,)])
    zeros = np.zeros((n_params, size))
    state = [np.ones(size), np.zeros(size), np.zeros(size),
             zeros, zeros, zeros, zeros, np.zeros(size), zeros]
    params = list(params)
    for n in range(1, _MAX_TERMS + 1):
        a_prev, a_cur, b_prev, da_prev, da_cur, db_prev, db_cur, f, df = state
        an, bn, dan, dbn = coef(n, *params)
        a_new = bn * a_cur + an * a_prev
        b_new = bn + an * b_prev
        da_new = dbn * a_cur + bn * da_cur + dan * a_prev + an * da_prev
        db_new = dbn + bn * db_cur + dan * b_prev + an * db_prev
        scale = 1.0 / np.where(b_new == 0, _TINY, b_new)
        f_new = a_new * scale
        df_new = (da_new - f_new * db_new) * scale
        state = [a_cur * scale, f_new, scale, da_cur * scale, da_new * scale,
                 db_cur * scale, db_new * scale, f_new, df_new]
        if n < 3:
            continue
        # NaN compares False: elements with NaN operands finish at once.
        moving = (np.abs(f_new - f) > _EPS * np.abs(f_new)) | np.any(
            np.abs(df_new - df) > _EPS * np.maximum(np.abs(df_new),
                                                    np.abs(f_new)), axis=0)
        rest = acc.retire(~moving, (f_new, df_new), state + params)
        state, params = rest[:len(state)], rest[len(state):]
        if not acc.live.size:
            break
    acc.retire(np.ones(acc.live.shape, bool), state[-2:], [])
    return acc.outs


def _igamma_series(a, x):
    """P(a, x) = x^a e^-x / Gamma(a + 1) * S, S = sum_n prod_k x / (a + k);
    returns (S, dS/da) for 1-D a, x. Converges fast for x < a + 1."""
    acc = _Converging(a.shape[0], [(), ()])
    term, dterm = np.ones_like(x), np.zeros_like(x)
    s, ds = np.ones_like(x), np.zeros_like(x)
    for n in range(1, _MAX_TERMS + 1):
        ratio = x / (a + n)
        dterm = (dterm - term / (a + n)) * ratio
        term = term * ratio
        s = s + term
        ds = ds + dterm
        moving = (np.abs(term) > _EPS * np.abs(s)) | (
            np.abs(dterm) > _EPS * np.maximum(np.abs(ds), np.abs(s)))
        a, x, term, dterm, s, ds = acc.retire(
            ~moving, (s, ds), [a, x, term, dterm, s, ds])
        if not acc.live.size:
            break
    acc.retire(np.ones(acc.live.shape, bool), (s, ds), [])
    return acc.outs


def _igammac_fraction(a, x):
    """Q(a, x) = x^a e^-x / Gamma(a) * f with
    f = 1 / (x + 1 - a - 1 (1 - a) / (x + 3 - a - 2 (2 - a) / ...));
    returns (f, df/da) for 1-D a, x. Converges fast for x >= a + 1."""

    def coef(n, a, x):
        if n == 1:
            return 1.0, x + 1 - a, 0.0, -1.0
        k = n - 1
        return -k * (k - a), x + 2 * k + 1 - a, float(k), -1.0

    f, df = _continued_fraction(coef, (a, x), 1)
    return f, df[0]


def _igamma_grad_a(a, x):
    from scipy import special as sp  # lazy: only when the kernel first runs

    dtype = np.result_type(a, x)
    a, x = _f64(a, x)
    out = np.zeros_like(x)
    with np.errstate(all="ignore"):
        series = x < a + 1
        for where, fn in ((series, _igamma_series),
                          (~series, _igammac_fraction)):
            if not where.any():
                continue
            aa, xx = a[where], x[where]
            s, ds = fn(aa, xx)
            log_x = np.log(xx)
            if fn is _igamma_series:
                pre = np.exp(aa * log_x - xx - sp.gammaln(aa + 1))
                out[where] = pre * (ds + s * (log_x - sp.digamma(aa + 1)))
            else:
                pre = np.exp(aa * log_x - xx - sp.gammaln(aa))
                out[where] = -pre * (ds + s * (log_x - sp.digamma(aa)))
        # P(a, 0) = 0 and P(a, inf) = 1 for every a > 0.
        out = np.where((x == 0) | (x == np.inf), 0.0, out)
        out = np.where((a <= 0) | (x < 0) | np.isnan(a) | np.isnan(x),
                       np.nan, out)
    return out.astype(dtype)


def _betainc_fraction(a, b, x):
    """I_x(a, b) = x^a (1 - x)^b / (a B(a, b)) * f with Numerical Recipes'
    fraction f = 1 / (1 + d1 / (1 + d2 / ...)); returns (f, df/da, df/db).
    Converges fast for x < (a + 1) / (a + b + 2). a, b, x are 1-D."""

    def coef(n, a, b, x):
        if n == 1:
            return 1.0, 1.0, 0.0, 0.0
        k = n - 1  # d_k
        if k % 2:  # d_{2m+1} = -(a+m)(a+b+m) x / ((a+2m)(a+2m+1))
            m = (k - 1) // 2
            num = -(a + m) * (a + b + m) * x
            den = (a + 2 * m) * (a + 2 * m + 1)
            d = num / den
            dd_a = (-(a + b + m) * x - (a + m) * x) / den - d * (
                1 / (a + 2 * m) + 1 / (a + 2 * m + 1))
            dd_b = -(a + m) * x / den
        else:  # d_{2m} = m (b - m) x / ((a+2m-1)(a+2m))
            m = k // 2
            den = (a + 2 * m - 1) * (a + 2 * m)
            d = m * (b - m) * x / den
            dd_a = -d * (1 / (a + 2 * m - 1) + 1 / (a + 2 * m))
            dd_b = m * x / den
        return d, 1.0, np.stack([dd_a, dd_b]), 0.0

    return _continued_fraction(coef, (a, b, x), 2)


def _betainc_grad_ab(a, b, x):
    from scipy import special as sp  # lazy: only when the kernel first runs

    dtype = np.result_type(a, b, x)
    a, b, x = _f64(a, b, x)
    da, db = np.zeros_like(x), np.zeros_like(x)
    with np.errstate(all="ignore"):
        # Away from the fraction's fast region use
        # I_x(a, b) = 1 - I_{1-x}(b, a).
        flip = x >= (a + 1) / (a + b + 2)
        p, q = np.where(flip, b, a), np.where(flip, a, b)
        y = np.where(flip, 1 - x, x)
        f, df = _betainc_fraction(p.ravel(), q.ravel(), y.ravel())
        f, df = f.reshape(x.shape), df.reshape((2,) + x.shape)
        log_pre = (p * np.log(y) + q * np.log1p(-y) - np.log(p)
                   - sp.betaln(p, q))
        pre = np.exp(log_pre)
        psi_pq = sp.digamma(p + q)
        dlog_p = np.log(y) - 1 / p - sp.digamma(p) + psi_pq
        dlog_q = np.log1p(-y) - sp.digamma(q) + psi_pq
        d_p = pre * (df[0] + f * dlog_p)
        d_q = pre * (df[1] + f * dlog_q)
        sign = np.where(flip, -1.0, 1.0)
        da = sign * np.where(flip, d_q, d_p)
        db = sign * np.where(flip, d_p, d_q)
        # I_0 = 0 and I_1 = 1 for every a, b > 0.
        edge = (x == 0) | (x == 1)
        bad = (a <= 0) | (b <= 0) | (x < 0) | (x > 1) | np.isnan(a + b + x)
        da = np.where(bad, np.nan, np.where(edge, 0.0, da))
        db = np.where(bad, np.nan, np.where(edge, 0.0, db))
    return da.astype(dtype), db.astype(dtype)


_rule = shape_rules.elementwise()


def _pair_rule(a, b, x):
    out = _rule(a, b, x)
    return out, out


_SECOND_ORDER = (
    "second derivatives of the incomplete {} function in its shape "
    "parameters are not implemented (first derivatives are exact)"
)

# igamma_grad_a(a, x): d P(a, x) / da (= -d Q(a, x) / da).
igamma_grad_a_p = Primitive(
    "igamma_grad_a", _rule, _igamma_grad_a,
    nondiff=_SECOND_ORDER.format("gamma"),
)
# betainc_grad_ab(a, b, x) -> (d I_x(a, b) / da, d I_x(a, b) / db).
betainc_grad_ab_p = Primitive(
    "betainc_grad_ab", _pair_rule, _betainc_grad_ab, multiple_results=True,
    nondiff=_SECOND_ORDER.format("beta"),
)


# -- cost rules (formulas and constants: keras_ipu/device/simulator/cost_model.py)

# A series / continued fraction of a few dozen terms, each a handful of
# transcendental-class operations, per element (and per output).
_SERIES_COST = _cost.elementwise(40 * _cost_model.TRANSCENDENTAL_FLOPS)
igamma_grad_a_p.cost = _SERIES_COST
betainc_grad_ab_p.cost = _SERIES_COST
