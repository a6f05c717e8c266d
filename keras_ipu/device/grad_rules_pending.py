"""Gradient rules of the primitives in elementwise.py, convert.py,
special.py, reduce.py, cumulative.py, sort.py and dot.py.

They belong beside their primitives (decision 1: one primitive, one place);
they live here only while those files are being edited by others, and are
to be moved next to each primitive (`xxx_p.grad = _xxx_grad`) as they are.
The contract is in autodiff.py. Imported by autodiff.
"""

import numpy as np

from keras_ipu.device.primitives import ad_util
from keras_ipu.device.primitives import convert as cv
from keras_ipu.device.primitives import cumulative
from keras_ipu.device.primitives import dot
from keras_ipu.device.primitives import elementwise as ew
from keras_ipu.device.primitives import reduce
from keras_ipu.device.primitives import shape_rules
from keras_ipu.device.primitives import sort
from keras_ipu.device.primitives import special
from keras_ipu.device.primitives import structure

_unb = ad_util.unbroadcast


def _c(value, like):
    return ad_util.scalar(value, like.dtype)


def mul(a, b):
    return ew.mul_p.bind(a, b)


def div(a, b):
    return ew.div_p.bind(a, b)


def add(a, b):
    return ew.add_p.bind(a, b)


def sub(a, b):
    return ew.sub_p.bind(a, b)


def neg(a):
    return ew.neg_p.bind(a)


def square(a):
    return ew.mul_p.bind(a, a)


# -- unary elementwise ------------------------------------------------------


def _unary(derivative):
    """Rule for y = f(x): x_ct = g * derivative(x, y)."""

    def rule(cts, inputs, outputs, **params):
        (g,), (x,), (y,) = cts, inputs, outputs
        return [mul(g, derivative(x, y))]

    return rule


def _zero_rule(cts, inputs, outputs, **params):
    return [None] * len(inputs)


ew.neg_p.grad = lambda cts, i, o: [neg(cts[0])]
def _abs_grad(cts, inputs, outputs):
    (g,), (x,), (y,) = cts, inputs, outputs
    if x.dtype.kind != "c":
        return [mul(g, ew.sign_p.bind(x))]
    # d|z| = Re(conj(z) dz) / |z|: the cotangent is g conj(z) / |z| (zero
    # at z = 0).
    is_zero = ew.eq_p.bind(y, _c(0, y))
    scale = div(g, ew.select_p.bind(is_zero, _c(1, y), y))
    scale = ew.select_p.bind(is_zero, _c(0, scale), scale)
    return [mul(ad_util.convert(scale, x.dtype), ew.conj_p.bind(x))]


ew.abs_p.grad = _abs_grad
for _p in (ew.sign_p, ew.floor_p, ew.ceil_p, ew.round_p, ew.trunc_p):
    # Piecewise constant: zero almost everywhere.
    _p.grad = _zero_rule
ew.exp_p.grad = _unary(lambda x, y: y)
ew.exp2_p.grad = _unary(lambda x, y: mul(y, _c(np.log(2.0), y)))
ew.expm1_p.grad = _unary(lambda x, y: add(y, _c(1, y)))
ew.log_p.grad = _unary(lambda x, y: ew.reciprocal_p.bind(x))
ew.log1p_p.grad = _unary(lambda x, y: ew.reciprocal_p.bind(add(x, _c(1, x))))
ew.log2_p.grad = _unary(
    lambda x, y: ew.reciprocal_p.bind(mul(x, _c(np.log(2.0), x))))
ew.log10_p.grad = _unary(
    lambda x, y: ew.reciprocal_p.bind(mul(x, _c(np.log(10.0), x))))
ew.sqrt_p.grad = _unary(lambda x, y: div(_c(0.5, y), y))
ew.rsqrt_p.grad = _unary(lambda x, y: mul(_c(-0.5, y), div(y, x)))
ew.cbrt_p.grad = _unary(
    lambda x, y: ew.reciprocal_p.bind(mul(_c(3, y), square(y))))
ew.reciprocal_p.grad = _unary(lambda x, y: neg(square(y)))
ew.square_p.grad = _unary(lambda x, y: mul(_c(2, x), x))
ew.sin_p.grad = _unary(lambda x, y: ew.cos_p.bind(x))
ew.cos_p.grad = _unary(lambda x, y: neg(ew.sin_p.bind(x)))
ew.tan_p.grad = _unary(lambda x, y: add(_c(1, y), square(y)))
ew.asin_p.grad = _unary(lambda x, y: ew.rsqrt_p.bind(sub(_c(1, x), square(x))))
ew.acos_p.grad = _unary(
    lambda x, y: neg(ew.rsqrt_p.bind(sub(_c(1, x), square(x)))))
ew.atan_p.grad = _unary(
    lambda x, y: ew.reciprocal_p.bind(add(_c(1, x), square(x))))
ew.sinh_p.grad = _unary(lambda x, y: ew.cosh_p.bind(x))
ew.cosh_p.grad = _unary(lambda x, y: ew.sinh_p.bind(x))
ew.tanh_p.grad = _unary(lambda x, y: sub(_c(1, y), square(y)))
ew.asinh_p.grad = _unary(lambda x, y: ew.rsqrt_p.bind(add(square(x), _c(1, x))))
ew.acosh_p.grad = _unary(
    lambda x, y: ew.rsqrt_p.bind(
        mul(sub(x, _c(1, x)), add(x, _c(1, x)))))
ew.atanh_p.grad = _unary(
    lambda x, y: ew.reciprocal_p.bind(sub(_c(1, x), square(x))))
ew.logistic_p.grad = _unary(lambda x, y: mul(y, sub(_c(1, y), y)))
ew.conj_p.grad = lambda cts, i, o: [ew.conj_p.bind(cts[0])]


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


ew.real_p.grad = _real_grad
ew.imag_p.grad = _imag_grad
ew.angle_p.grad = _angle_grad


# -- binary elementwise -----------------------------------------------------


def _binary(dx, dy):
    """Rule for z = f(x, y): x_ct = g * dx(x, y, z), y_ct = g * dy(...),
    each summed back to its operand's shape."""

    def rule(cts, inputs, outputs, **params):
        (g,), (x, y), (z,) = cts, inputs, outputs
        return [
            None if dx is None else _unb(mul(g, dx(x, y, z)), x.shape),
            None if dy is None else _unb(mul(g, dy(x, y, z)), y.shape),
        ]

    return rule


def _add_grad(cts, inputs, outputs):
    (g,), (x, y) = cts, inputs
    return [_unb(g, x.shape), _unb(g, y.shape)]


def _sub_grad(cts, inputs, outputs):
    (g,), (x, y) = cts, inputs
    return [_unb(g, x.shape), _unb(neg(g), y.shape)]


def _safe_log(x):
    # log(x) where x != 0; the term it multiplies is zero there.
    is_zero = ew.eq_p.bind(x, _c(0, x))
    return ew.log_p.bind(ew.select_p.bind(is_zero, _c(1, x), x))


def _pow_dx(x, y, z):
    y_zero = ew.eq_p.bind(y, _c(0, y))
    deriv = mul(y, ew.pow_p.bind(x, sub(y, _c(1, y))))
    return ew.select_p.bind(y_zero, _c(0, deriv), deriv)


def _minmax_rule(strict):
    def rule(cts, inputs, outputs):
        (g,), (x, y) = cts, inputs
        one, half = _c(1, g), _c(0.5, g)
        x_wins = strict.bind(x, y)
        tie = ew.eq_p.bind(x, y)
        zero = _c(0, g)
        share_x = ew.select_p.bind(x_wins, one, ew.select_p.bind(tie, half, zero))
        share_y = ew.select_p.bind(x_wins, zero, ew.select_p.bind(tie, half, one))
        return [_unb(mul(g, share_x), x.shape), _unb(mul(g, share_y), y.shape)]

    return rule


def _copysign_dx(x, y, z):
    same = ew.eq_p.bind(ew.signbit_p.bind(x), ew.signbit_p.bind(y))
    return ew.select_p.bind(same, _c(1, x), _c(-1, x))


ew.add_p.grad = _add_grad
ew.sub_p.grad = _sub_grad
ew.mul_p.grad = _binary(lambda x, y, z: y, lambda x, y, z: x)
ew.div_p.grad = _binary(
    lambda x, y, z: ew.reciprocal_p.bind(y), lambda x, y, z: neg(div(z, y)))
ew.floor_div_p.grad = _zero_rule
ew.rem_p.grad = _binary(
    lambda x, y, z: _c(1, x),
    lambda x, y, z: neg(ew.trunc_p.bind(div(x, y))))
ew.mod_p.grad = _binary(
    lambda x, y, z: _c(1, x),
    lambda x, y, z: neg(ew.floor_p.bind(div(x, y))))
ew.pow_p.grad = _binary(_pow_dx, lambda x, y, z: mul(z, _safe_log(x)))
ew.max_p.grad = _minmax_rule(ew.gt_p)
ew.min_p.grad = _minmax_rule(ew.lt_p)
ew.atan2_p.grad = _binary(
    lambda x, y, z: div(y, add(square(x), square(y))),
    lambda x, y, z: neg(div(x, add(square(x), square(y)))))
ew.hypot_p.grad = _binary(lambda x, y, z: div(x, z), lambda x, y, z: div(y, z))
ew.copysign_p.grad = _binary(_copysign_dx, None)
ew.logaddexp_p.grad = _binary(
    lambda x, y, z: ew.exp_p.bind(sub(x, z)),
    lambda x, y, z: ew.exp_p.bind(sub(y, z)))
ew.logaddexp2_p.grad = _binary(
    lambda x, y, z: ew.exp2_p.bind(sub(x, z)),
    lambda x, y, z: ew.exp2_p.bind(sub(y, z)))


def _select_grad(cts, inputs, outputs):
    (g,), (pred, on_true, on_false) = cts, inputs
    zero = _c(0, g)
    return [
        None,
        _unb(ew.select_p.bind(pred, g, zero), on_true.shape),
        _unb(ew.select_p.bind(pred, zero, g), on_false.shape),
    ]


def _clamp_grad(cts, inputs, outputs):
    (g,), (lo, x, hi) = cts, inputs
    zero = _c(0, g)
    below = ew.lt_p.bind(x, lo)
    above = ew.gt_p.bind(x, hi)
    inside = ew.logical_not_p.bind(ew.or_p.bind(below, above))
    return [
        _unb(ew.select_p.bind(below, g, zero), lo.shape),
        _unb(ew.select_p.bind(inside, g, zero), x.shape),
        _unb(ew.select_p.bind(above, g, zero), hi.shape),
    ]


ew.select_p.grad = _select_grad
ew.clamp_p.grad = _clamp_grad


# -- special functions -----------------------------------------------------

_TWO_OVER_SQRT_PI = 2.0 / np.sqrt(np.pi)


def _nonzero_x(x):
    is_zero = ew.eq_p.bind(x, _c(0, x))
    return is_zero, ew.select_p.bind(is_zero, _c(1, x), x)


def _i1_deriv(x, y):
    # i1'(x) = i0(x) - i1(x) / x, and 1/2 at x = 0.
    is_zero, safe = _nonzero_x(x)
    d = sub(special.i0_p.bind(x), div(y, safe))
    return ew.select_p.bind(is_zero, _c(0.5, x), d)


def _i1e_deriv(x, y):
    # i1e'(x) = i0e(x) - i1e(x) (sign(x) + 1/x), and 1/2 at x = 0.
    is_zero, safe = _nonzero_x(x)
    d = sub(
        special.i0e_p.bind(x),
        mul(y, add(ew.sign_p.bind(x), ew.reciprocal_p.bind(safe))),
    )
    return ew.select_p.bind(is_zero, _c(0.5, x), d)


special.erf_p.grad = _unary(
    lambda x, y: mul(_c(_TWO_OVER_SQRT_PI, x), ew.exp_p.bind(neg(square(x)))))
special.erfc_p.grad = _unary(
    lambda x, y: mul(_c(-_TWO_OVER_SQRT_PI, x), ew.exp_p.bind(neg(square(x)))))
special.erfinv_p.grad = _unary(
    lambda x, y: mul(_c(np.sqrt(np.pi) / 2, y), ew.exp_p.bind(square(y))))
special.lgamma_p.grad = _unary(lambda x, y: special.digamma_p.bind(x))
special.i0_p.grad = _unary(lambda x, y: special.i1_p.bind(x))
special.i0e_p.grad = _unary(
    lambda x, y: sub(special.i1e_p.bind(x), mul(ew.sign_p.bind(x), y)))
special.i1_p.grad = _unary(_i1_deriv)
special.i1e_p.grad = _unary(_i1e_deriv)


# -- conversion -------------------------------------------------------------


def _convert_grad(cts, inputs, outputs, *, dtype):
    (g,), (x,) = cts, inputs
    if not ad_util.is_differentiable(x.dtype):
        return [None]
    if not ad_util.is_differentiable(np.dtype(dtype)):
        return [None]
    return [ad_util.convert(g, x.dtype)]


cv.convert_element_type_p.grad = _convert_grad


# -- reductions -------------------------------------------------------------


def _axes(x, axes):
    return shape_rules.normalize_axes(axes, x.ndim)


def _reduce_sum_grad(cts, inputs, outputs, *, axes):
    (g,), (x,) = cts, inputs
    return [ad_util.broadcast_back(g, x, _axes(x, axes))]


def _reduce_extremum_grad(cts, inputs, outputs, *, axes):
    # The cotangent is shared equally among the entries equal to the
    # extremum (ties split it, as JAX does).
    (g,), (x,), (y,) = cts, inputs, outputs
    axes = _axes(x, axes)
    y_full = ad_util.broadcast_back(y, x, axes)
    hit = ad_util.convert(ew.eq_p.bind(x, y_full), g.dtype)
    count = reduce.reduce_sum_p.bind(hit, axes=axes)
    share = div(g, count)
    return [mul(hit, ad_util.broadcast_back(share, x, axes))]


def _reduce_prod_grad(cts, inputs, outputs, *, axes):
    # d prod / d x_i = product of the other entries: computed with an
    # exclusive prefix and suffix product, so zeros in x are exact.
    (g,), (x,) = cts, inputs
    axes = _axes(x, axes)
    keep = tuple(i for i in range(x.ndim) if i not in axes)
    perm = keep + axes
    xt = structure.transpose_p.bind(x, permutation=perm)
    lead = tuple(xt.shape[: len(keep)])
    n = shape_rules.mul_dims(xt.shape[len(keep):])
    flat = ad_util.reshape(xt, lead + (n,))
    axis = flat.ndim - 1
    one = _c(1, flat)
    pad_lo = ((0, 0, 0),) * axis + ((1, -1, 0),)
    pad_hi = ((0, 0, 0),) * axis + ((-1, 1, 0),)
    before = structure.pad_p.bind(
        cumulative.cumprod_p.bind(flat, axis=axis), one, config=pad_lo)
    after = structure.pad_p.bind(
        cumulative.cumprod_p.bind(flat, axis=axis, reverse=True), one,
        config=pad_hi)
    others = mul(before, after)
    others = ad_util.reshape(others, xt.shape)
    inv = tuple(int(i) for i in np.argsort(perm))
    others = structure.transpose_p.bind(others, permutation=inv)
    return [mul(ad_util.broadcast_back(g, x, axes), others)]


reduce.reduce_sum_p.grad = _reduce_sum_grad
reduce.reduce_max_p.grad = _reduce_extremum_grad
reduce.reduce_min_p.grad = _reduce_extremum_grad
reduce.reduce_prod_p.grad = _reduce_prod_grad
reduce.bincount_p.nondiff = (
    "value-dependent output length: eager only, so never traced or "
    "differentiated"
)


# -- cumulative -------------------------------------------------------------


def _cumsum_grad(cts, inputs, outputs, *, axis, reverse=False):
    (g,) = cts
    return [cumulative.cumsum_p.bind(g, axis=axis, reverse=not reverse)]


def _cumprod_grad(cts, inputs, outputs, *, axis, reverse=False):
    # out_j = prod_{i<=j} x_i: x_i's cotangent is sum_{j>=i} g_j out_j / x_i.
    # Exact for non-zero x (a zero entry gives inf/nan, as the division).
    (g,), (x,), (y,) = cts, inputs, outputs
    acc = cumulative.cumsum_p.bind(mul(g, y), axis=axis, reverse=not reverse)
    return [div(acc, x)]


cumulative.cumsum_p.grad = _cumsum_grad
cumulative.cumprod_p.grad = _cumprod_grad


# -- sorting ----------------------------------------------------------------


def _iota_like(x, dimension):
    idx = structure.iota_p.bind(
        dtype=np.dtype(np.int32), shape=tuple(x.shape), dimension=dimension)
    return idx


def _sort_grad(cts, inputs, outputs, *, dimension, num_keys=1,
               descending=False):
    # The sorting permutation (sorting an iota along with the keys), then
    # each cotangent is put back in place by sorting it by that permutation.
    dimension = dimension % inputs[0].ndim
    keys = inputs[:num_keys]
    perm = sort.sort_p.bind(
        *keys, _iota_like(inputs[0], dimension), dimension=dimension,
        num_keys=num_keys, descending=descending)[-1]
    live = [i for i, (g, x) in enumerate(zip(cts, inputs))
            if g is not None and ad_util.is_differentiable(x.dtype)]
    if not live:
        return [None] * len(inputs)
    back = sort.sort_p.bind(
        perm, *(cts[i] for i in live), dimension=dimension, num_keys=1)[1:]
    out = [None] * len(inputs)
    for i, b in zip(live, back):
        out[i] = b
    return out


def _top_k_grad(cts, inputs, outputs, *, k, index_dtype=np.dtype(np.int32)):
    (g, _), (x,), (_, indices) = cts, inputs, outputs
    if g is None:
        return [None]
    return [ad_util.scatter_add_last_axis(x, indices, g)]


sort.sort_p.grad = _sort_grad
sort.top_k_p.grad = _top_k_grad


# -- dot_general ------------------------------------------------------------


def _dot_transpose_lhs(g, y, x_ndim, dims, y_is_lhs=False):
    """Cotangent of the lhs x of dot_general(x, y) for output cotangent g
    (with y_is_lhs: of the rhs, y being the lhs)."""
    (xc, yc), (xb, yb) = dims
    y_ndim = y.ndim
    xf = [d for d in range(x_ndim) if d not in xc and d not in xb]
    yf = [d for d in range(y_ndim) if d not in yc and d not in yb]
    nb = len(xb)
    # Output axes: batch, then lhs free, then rhs free.
    if y_is_lhs:
        g_y_free = list(range(nb, nb + len(yf)))
        g_x_free = list(range(nb + len(yf), nb + len(yf) + len(xf)))
    else:
        g_x_free = list(range(nb, nb + len(xf)))
        g_y_free = list(range(nb + len(xf), nb + len(xf) + len(yf)))
    del g_x_free
    g_batch = list(range(nb))
    res = dot.dot_general_p.bind(
        g, y,
        dimension_numbers=((tuple(g_y_free), tuple(yf)),
                           (tuple(g_batch), tuple(yb))),
    )
    # res axes: batch, x free, then y's remaining (contracting) axes in
    # increasing y order, each paired with an x contracting axis.
    order = np.argsort(yc)
    x_axes = list(xb) + xf + [xc[i] for i in order]
    perm = tuple(int(i) for i in np.argsort(x_axes))
    if perm != tuple(range(len(perm))):
        res = structure.transpose_p.bind(res, permutation=perm)
    return res


def _dot_general_grad(cts, inputs, outputs, *, dimension_numbers,
                      preferred_element_type=None):
    (g,), (x, y) = cts, inputs
    (xc, yc), (xb, yb) = dimension_numbers
    g = ad_util.convert(g, x.dtype)
    x_ct = _dot_transpose_lhs(g, y, x.ndim, dimension_numbers)
    y_ct = _dot_transpose_lhs(
        g, x, y.ndim, ((yc, xc), (yb, xb)), y_is_lhs=True)
    return [x_ct, y_ct]


dot.dot_general_p.grad = _dot_general_grad


def _cum_extremum_grad(cmp):
    """out_i = x_a(i), a(i) being the last index <= i where x reaches the
    running extremum (x_j == out_j): a = cummax of those indices. Each g_i
    is added at a(i)."""

    def rule(cts, inputs, outputs, *, axis, reverse=False):
        (g,), (x,), (y,) = cts, inputs, outputs
        if x.ndim == 0:
            return [g]
        axis = axis % x.ndim
        if reverse:
            x, y, g = (structure.rev_p.bind(v, axes=(axis,)) for v in (x, y, g))
        last = x.ndim - 1
        perm = tuple(i for i in range(x.ndim) if i != axis) + (axis,)
        x, y, g = (structure.transpose_p.bind(v, permutation=perm)
                   for v in (x, y, g))
        iota = structure.iota_p.bind(dtype=np.dtype(np.int32),
                                     shape=tuple(x.shape), dimension=last)
        reached = ew.eq_p.bind(x, y)
        marks = ew.select_p.bind(reached, iota, np.int32(-1))
        where = cumulative.cummax_p.bind(marks, axis=last)
        ct = ad_util.scatter_add_last_axis(x, where, g)
        ct = structure.transpose_p.bind(
            ct, permutation=tuple(int(i) for i in np.argsort(perm)))
        if reverse:
            ct = structure.rev_p.bind(ct, axes=(axis,))
        return [ct]

    return rule


cumulative.cummax_p.grad = _cum_extremum_grad(ew.gt_p)
cumulative.cummin_p.grad = _cum_extremum_grad(ew.lt_p)


def _trigamma(x):
    """psi'(x) from primitives: six steps of psi'(x) = psi'(x + 1) + 1/x^2,
    then the asymptotic series at x + 6 (error < 1e-12 there); x < 1/2 by
    the reflection psi'(1 - x) + psi'(x) = pi^2 / sin^2(pi x)."""

    def positive(z):
        total = None
        for k in range(6):
            zk = add(z, _c(k, z))
            total = ad_util.add_any(total, ew.reciprocal_p.bind(square(zk)))
        w = add(z, _c(6, z))
        inv = ew.reciprocal_p.bind(w)
        inv2 = square(inv)
        # 1/w + 1/(2w^2) + 1/(6w^3) - 1/(30w^5) + 1/(42w^7) - 1/(30w^9)
        series = _c(-1.0 / 30, w)
        for coef in (1.0 / 42, -1.0 / 30, 1.0 / 6):
            series = add(mul(series, inv2), _c(coef, w))
        series = mul(series, mul(inv2, inv))
        series = add(series, add(inv, mul(_c(0.5, w), inv2)))
        return add(total, series)

    small = ew.lt_p.bind(x, _c(0.5, x))
    safe_x = ew.select_p.bind(small, sub(_c(1, x), x), x)
    direct = positive(safe_x)
    s = ew.sin_p.bind(mul(_c(np.pi, x), x))
    reflected = sub(div(_c(np.pi ** 2, x), square(s)), direct)
    return ew.select_p.bind(small, reflected, direct)


special.digamma_p.grad = _unary(lambda x, y: _trigamma(x))
