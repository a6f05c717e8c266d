"""Keras backend `linalg` ops for the ipu backend (built from device primitives).

Factorisations are the primitives of keras_ipu.device.primitives.linalg
(cholesky, qr, svd, eigh, eig, lu, triangular_solve); det, slogdet, inv,
solve, lstsq, pinv, matrix_rank and norm are composed from them. Every op
batches over the leading axes. Integer and boolean inputs are computed in
floating point (Keras' result type of their dtype with a Python float).
"""

import numpy as np

from keras.src.backend.common import dtypes
from keras.src.backend.common import standardize_dtype

from keras_ipu.backend import prims
from keras_ipu.backend.core import convert_to_tensor
from keras_ipu.device.array import Tensor
from keras_ipu.device.primitives import elementwise as ew
from keras_ipu.device.primitives import linalg as lp
from keras_ipu.device.primitives import reduce as red
from keras_ipu.device.primitives import shape_rules
from keras_ipu.device.primitives.dot import dot_general_p
from keras_ipu.device.primitives.structure import broadcast_to_p
from keras_ipu.device.primitives.structure import reshape_p
from keras_ipu.device.primitives.structure import transpose_p

# ------------------------------------------------------------------ helpers


def _is_inexact(dtype):
    return dtype.kind in "fc" or dtype.name == "bfloat16"


def as_inexact(x):
    """x as a tensor of a float (or complex) dtype."""
    x = convert_to_tensor(x)
    if _is_inexact(x.dtype):
        return x
    return convert_to_tensor(x, dtypes.result_type(standardize_dtype(x.dtype), float))


def common_inexact_dtype(*xs):
    """The float dtype xs are computed in: their own when they share one
    (float64 stays float64 eagerly: the host computes it), else Keras'
    result type with a Python float."""
    names = {standardize_dtype(x.dtype) for x in xs}
    if len(names) == 1 and _is_inexact(xs[0].dtype):
        return names.pop()
    return dtypes.result_type(*names, float)


def _inexact_pair(a, b):
    a, b = convert_to_tensor(a), convert_to_tensor(b)
    dtype = common_inexact_dtype(a, b)
    return convert_to_tensor(a, dtype), convert_to_tensor(b, dtype)


def _eps(dtype):
    dtype = np.dtype(dtype)
    if dtype.kind == "c":
        dtype = np.dtype(np.float32 if dtype.itemsize == 8 else np.float64)
    if dtype.name == "bfloat16":
        import ml_dtypes

        return float(ml_dtypes.finfo(dtype).eps)
    return float(np.finfo(dtype).eps)


def _known(dim, what):
    if dim is None:
        raise ValueError(
            f"{what} must be known (not None) for this op: it sizes a "
            "constant (identity, mask) of the program. Give the matrix a "
            "static size."
        )
    return dim


def _check_matrix(x, name, square=False):
    if x.ndim < 2:
        raise ValueError(
            f"`{name}` expects a matrix or a batch of matrices (rank >= 2). "
            f"Received input with shape {tuple(x.shape)}."
        )
    m, n = x.shape[-2:]
    if square and m is not None and n is not None and m != n:
        raise ValueError(
            f"`{name}` expects square matrices (the last two dimensions "
            f"equal). Received input with shape {tuple(x.shape)}."
        )


def _eye(n, dtype):
    return np.eye(_known(n, "The matrix order"), dtype=dtype)


def _adjoint(x):
    """Conjugate transpose of the last two axes."""
    perm = tuple(range(x.ndim - 2)) + (x.ndim - 1, x.ndim - 2)
    x = transpose_p.bind(x, permutation=perm)
    return ew.conj_p.bind(x) if x.dtype.kind == "c" else x


def _matmul(a, b):
    """a @ b for (batches of) matrices of one dtype, batch axes broadcast."""
    batch = shape_rules.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    if tuple(a.shape[:-2]) != batch:
        a = broadcast_to_p.bind(a, shape=batch + tuple(a.shape[-2:]))
    if tuple(b.shape[:-2]) != batch:
        b = broadcast_to_p.bind(b, shape=batch + tuple(b.shape[-2:]))
    nb = len(batch)
    batch_axes = tuple(range(nb))
    return dot_general_p.bind(
        a, b, dimension_numbers=(((nb + 1,), (nb,)), (batch_axes, batch_axes))
    )


def _diagonal(x):
    """The main diagonal of square matrices (..., n, n) -> (..., n)."""
    mask = np.eye(_known(x.shape[-1], "The matrix order"), dtype=bool)
    on_diag = ew.select_p.bind(mask, x, prims.scalar(0, x.dtype))
    return red.reduce_sum_p.bind(on_diag, axes=(x.ndim - 1,))


def _pivot_sign(pivots, dtype):
    """+1 / -1: the parity of LAPACK's row swaps (row i <-> pivots[i])."""
    k = _known(pivots.shape[-1], "The number of pivots")
    moved = ew.ne_p.bind(pivots, np.arange(k, dtype=pivots.dtype))
    swaps = red.reduce_sum_p.bind(prims.cast(moved, np.int32), axes=(pivots.ndim - 1,))
    odd = prims.cast(ew.rem_p.bind(swaps, prims.scalar(2, np.int32)), dtype)
    twice = ew.mul_p.bind(prims.scalar(2, dtype), odd)
    return ew.sub_p.bind(prims.scalar(1, dtype), twice)


def _permutation_matrix(permutation, dtype):
    """P with (P @ b)[i] = b[permutation[i]] (one-hot rows)."""
    m = _known(permutation.shape[-1], "The matrix order")
    hot = ew.eq_p.bind(
        prims.expand_dims(permutation, -1), np.arange(m, dtype=permutation.dtype)
    )
    return prims.cast(hot, dtype)


def _solve_params(lower, transpose_a=False, unit_diagonal=False):
    return dict(
        left_side=True,
        lower=lower,
        transpose_a=transpose_a,
        # Transposes here are always the adjoint (Hermitian factors).
        conjugate_a=transpose_a,
        unit_diagonal=unit_diagonal,
    )


# ------------------------------------------------------------ factorisations


def cholesky(a, upper=False):
    a = as_inexact(a)
    out = lp.cholesky_p.bind(a, lower=not upper)
    if isinstance(out, Tensor) and bool(
        red.reduce_or_p.bind(ew.isnan_p.bind(out), axes=tuple(range(out.ndim)))
    ):
        # The device gives NaNs; eagerly Keras wants an error, as NumPy's.
        raise ValueError(
            "Cholesky decomposition failed: the input is not a (numerically) "
            "positive-definite matrix. Check that it is symmetric with "
            "positive eigenvalues, or add a small multiple of the identity."
        )
    return out


def eig(a):
    return lp.eig_p.bind(as_inexact(a))


def eigh(a):
    return lp.eigh_p.bind(as_inexact(a), lower=True)


def lu_factor(a):
    lu, pivots, _ = lp.lu_p.bind(as_inexact(a))
    return lu, pivots


def qr(x, mode="reduced"):
    if mode not in {"reduced", "complete"}:
        raise ValueError(
            "`mode` argument value not supported. "
            "Expected one of {'reduced', 'complete'}. "
            f"Received: mode={mode}"
        )
    return lp.qr_p.bind(as_inexact(x), mode=mode)


def svd(x, full_matrices=True, compute_uv=True):
    out = lp.svd_p.bind(
        as_inexact(x), full_matrices=bool(full_matrices), compute_uv=bool(compute_uv)
    )
    return out if compute_uv else out[0]


# ------------------------------------------------------ determinants, solves


def det(a):
    a = as_inexact(a)
    _check_matrix(a, "det", square=True)
    lu, pivots, _ = lp.lu_p.bind(a)
    diag_product = red.reduce_prod_p.bind(_diagonal(lu), axes=(lu.ndim - 2,))
    return ew.mul_p.bind(_pivot_sign(pivots, lu.dtype), diag_product)


def slogdet(a):
    """(sign, log|det|) from the LU factors: the pivots give the sign of the
    row permutation, U's diagonal the rest; a singular matrix gives
    (0, -inf) as in NumPy."""
    a = as_inexact(a)
    _check_matrix(a, "slogdet", square=True)
    lu, pivots, _ = lp.lu_p.bind(a)
    diag = _diagonal(lu)
    magnitude = ew.abs_p.bind(diag)
    if diag.dtype.kind == "c":
        # diag / |diag|, with 0 where diag is 0.
        zero = ew.eq_p.bind(magnitude, prims.scalar(0, magnitude.dtype))
        safe = ew.select_p.bind(zero, prims.scalar(1, magnitude.dtype), magnitude)
        unit = ew.div_p.bind(diag, prims.cast(safe, diag.dtype))
    else:
        unit = ew.sign_p.bind(diag)
    last = diag.ndim - 1
    sign = ew.mul_p.bind(
        _pivot_sign(pivots, diag.dtype), red.reduce_prod_p.bind(unit, axes=(last,))
    )
    with np.errstate(divide="ignore"):
        logabsdet = red.reduce_sum_p.bind(ew.log_p.bind(magnitude), axes=(last,))
    return sign, logabsdet


def _lu_solve(a, b):
    """x with a x = b for square a (..., n, n) and b (..., n, k)."""
    lu, _, permutation = lp.lu_p.bind(a)
    b = _matmul(_permutation_matrix(permutation, lu.dtype), b)
    return _lu_solve_factored(lu, b)


def _lu_solve_factored(lu, b):
    """x with L U x = b, b already row-permuted."""
    y = lp.triangular_solve_p.bind(
        lu, b, **_solve_params(lower=True, unit_diagonal=True)
    )
    return lp.triangular_solve_p.bind(lu, y, **_solve_params(lower=False))


def _vector_or_matrix(a, b, solver):
    # As jnp.linalg.solve: b is a (batch of) vector(s) when it has one axis
    # less than a, else a (batch of) matrices.
    if b.ndim == a.ndim - 1:
        return prims.squeeze(solver(a, prims.expand_dims(b, -1)), -1)
    return solver(a, b)


def inv(a):
    a = as_inexact(a)
    _check_matrix(a, "inv", square=True)
    lu, _, permutation = lp.lu_p.bind(a)
    # The row-permuted identity is the permutation matrix itself.
    return _lu_solve_factored(lu, _permutation_matrix(permutation, lu.dtype))


def solve(a, b):
    a, b = _inexact_pair(a, b)
    _check_matrix(a, "solve", square=True)
    return _vector_or_matrix(a, b, _lu_solve)


def solve_triangular(a, b, lower=False):
    a, b = _inexact_pair(a, b)
    _check_matrix(a, "solve_triangular")

    def solver(a, b):
        return lp.triangular_solve_p.bind(a, b, **_solve_params(lower=lower))

    return _vector_or_matrix(a, b, solver)


def cholesky_inverse(a, upper=False):
    """The inverse of the matrix whose Cholesky factor is `a`."""
    a = as_inexact(a)
    _check_matrix(a, "cholesky_inverse", square=True)
    identity = _eye(a.shape[-1], a.dtype)
    lower = not upper
    # lower: A = L L^H, A^-1 = L^-H (L^-1 I); upper: A = U^H U,
    # A^-1 = U^-1 (U^-H I). Two triangular solves, no explicit inverse.
    first = lp.triangular_solve_p.bind(
        a, identity, **_solve_params(lower=lower, transpose_a=upper)
    )
    return lp.triangular_solve_p.bind(
        a, first, **_solve_params(lower=lower, transpose_a=lower)
    )


# --------------------------------------------------- SVD-based: pinv, lstsq


def _largest(s):
    return prims.expand_dims(red.reduce_max_p.bind(s, axes=(s.ndim - 1,)), -1)


def _default_rcond(x):
    m, n = x.shape[-2:]
    return _eps(x.dtype) * max(m or 1, n or 1)


def _pinv_factors(x, rcond):
    """(V diag(1/s), U) with singular values below rcond * s_max dropped:
    pinv(x) = V diag(1/s) U^H."""
    u, s, vh = lp.svd_p.bind(x, full_matrices=False, compute_uv=True)
    cutoff = ew.mul_p.bind(_largest(s), prims.scalar(rcond, s.dtype))
    keep = ew.gt_p.bind(s, cutoff)
    one = prims.scalar(1, s.dtype)
    s_inv = ew.select_p.bind(
        keep,
        ew.div_p.bind(one, ew.select_p.bind(keep, s, one)),
        prims.scalar(0, s.dtype),
    )
    s_inv = prims.expand_dims(prims.cast(s_inv, x.dtype), -2)
    v_scaled = ew.mul_p.bind(_adjoint(vh), s_inv)
    return v_scaled, u


def _inexact_matrices(x):
    """x as an inexact tensor of rank >= 2 (pinv, matrix_rank: Keras' message)."""
    x = as_inexact(x)
    if x.ndim < 2:
        raise ValueError(
            "Expected input to have rank >= 2. "
            f"Received input with shape {tuple(x.shape)}."
        )
    return x


def pinv(x, rcond=None):
    x = _inexact_matrices(x)
    if rcond is None:
        rcond = _default_rcond(x)
    v_scaled, u = _pinv_factors(x, rcond)
    return _matmul(v_scaled, _adjoint(u))


def lstsq(a, b, rcond=None):
    a, b = _inexact_pair(a, b)
    if a.ndim != 2:
        raise ValueError(f"Expected a to have rank 2. Received: a.shape={a.shape}")
    if b.ndim not in (1, 2):
        raise ValueError(
            f"Expected b to have rank 1 or 2. Received: b.shape={b.shape}"
        )
    if rcond is None:
        rcond = _default_rcond(a)
    v_scaled, u = _pinv_factors(a, rcond)
    column = b.ndim == 1
    if column:
        b = prims.expand_dims(b, -1)
    # V diag(1/s) (U^H b): never forms the n x m pseudo-inverse.
    x = _matmul(v_scaled, _matmul(_adjoint(u), b))
    return prims.squeeze(x, -1) if column else x


def matrix_rank(x, tol=None):
    x = _inexact_matrices(x)
    (s,) = lp.svd_p.bind(x, full_matrices=False, compute_uv=False)
    if tol is None:
        tol = ew.mul_p.bind(_largest(s), prims.scalar(_default_rcond(x), s.dtype))
    else:
        tol = convert_to_tensor(tol, standardize_dtype(s.dtype))
        if tol.ndim:
            # One tolerance per matrix of the batch.
            tol = prims.expand_dims(tol, -1)
    above = prims.cast(ew.gt_p.bind(s, tol), np.int32)
    return red.reduce_sum_p.bind(above, axes=(s.ndim - 1,))


# -------------------------------------------------------------------- norm

_MATRIX_ORDS = (None, "fro", "nuc", np.inf, -np.inf, 1, -1, 2, -2)


def _norm_axes(ndim, ord, axis):
    """The normalised axis tuple, or ValueError as NumPy/JAX raise it."""
    if axis is None:
        if ord is None or ndim in (1, 2):
            return tuple(range(ndim))
        raise ValueError(
            f"Improper number of dimensions to norm: a {ndim}-D input with "
            f"ord={ord!r} needs `axis` (one axis: vector norm, two: matrix norm)."
        )
    axes = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    if len(axes) not in (1, 2):
        raise ValueError(
            f"Improper number of axes to norm: axis={axis!r}. Give one axis "
            "(vector norm) or two (matrix norm)."
        )
    out = []
    for ax in axes:
        if not -ndim <= ax < ndim:
            raise ValueError(
                f"axis {ax} is out of bounds for an input of rank {ndim} "
                f"(axis={axis!r})."
            )
        out.append(int(ax) % ndim)
    if len(out) == 2 and out[0] == out[1]:
        raise ValueError(f"Duplicate axes given to norm: axis={axis!r}.")
    return tuple(out)


def _square_sum(x, axes):
    return red.reduce_sum_p.bind(ew.mul_p.bind(x, x), axes=axes)


def _vector_norm(a, ord, axes):
    """a is |x| (real)."""
    if ord is None or ord == 2:
        return ew.sqrt_p.bind(_square_sum(a, axes))
    if ord == np.inf:
        return red.reduce_max_p.bind(a, axes=axes)
    if ord == -np.inf:
        return red.reduce_min_p.bind(a, axes=axes)
    if ord == 0:
        nonzero = ew.ne_p.bind(a, prims.scalar(0, a.dtype))
        return red.reduce_sum_p.bind(prims.cast(nonzero, a.dtype), axes=axes)
    if ord == 1:
        return red.reduce_sum_p.bind(a, axes=axes)
    if isinstance(ord, str):
        raise ValueError(f"Invalid `ord` argument for vector norm. Received: ord={ord}")
    p = prims.scalar(ord, a.dtype)
    with np.errstate(divide="ignore"):
        total = red.reduce_sum_p.bind(ew.pow_p.bind(a, p), axes=axes)
        return ew.pow_p.bind(total, prims.scalar(1.0 / ord, a.dtype))


def _singular_values_last(x, axes):
    """Singular values of the matrices spanned by `axes` (moved last)."""
    rest = tuple(i for i in range(x.ndim) if i not in axes)
    x = transpose_p.bind(x, permutation=rest + axes)
    (s,) = lp.svd_p.bind(x, full_matrices=False, compute_uv=False)
    return s


def _matrix_norm(x, a, ord, axes):
    """x the input, a = |x|; axes = (row_axis, col_axis)."""
    row, col = axes
    if ord is None or ord == "fro":
        return ew.sqrt_p.bind(_square_sum(a, axes))
    if ord in (1, -1, np.inf, -np.inf):
        # 1: largest column sum; inf: largest row sum (min for negatives).
        summed, other = (row, col) if ord in (1, -1) else (col, row)
        sums = red.reduce_sum_p.bind(a, axes=(summed,))
        other -= other > summed
        pick = red.reduce_max_p if ord > 0 else red.reduce_min_p
        return pick.bind(sums, axes=(other,))
    if ord in (2, -2, "nuc"):
        s = _singular_values_last(x, axes)
        last = (s.ndim - 1,)
        if ord == "nuc":
            return red.reduce_sum_p.bind(s, axes=last)
        pick = red.reduce_max_p if ord == 2 else red.reduce_min_p
        return pick.bind(s, axes=last)
    raise ValueError(f"Invalid `ord` argument for matrix norm. Received: ord={ord}")


def norm(x, ord=None, axis=None, keepdims=False):
    x = as_inexact(x)
    axes = _norm_axes(x.ndim, ord, axis)
    a = ew.abs_p.bind(x)
    if axis is None and ord is None:
        out = ew.sqrt_p.bind(_square_sum(a, axes))
    elif len(axes) == 1:
        out = _vector_norm(a, ord, axes)
    else:
        if ord not in _MATRIX_ORDS:
            raise ValueError(
                f"Invalid `ord` argument for matrix norm. Received: ord={ord}"
            )
        out = _matrix_norm(x, a, ord, axes)
    if keepdims:
        shape = tuple(1 if i in axes else d for i, d in enumerate(x.shape))
        out = reshape_p.bind(out, new_shape=shape)
    return out


def jvp(fun, primals, tangents, has_aux=False):
    from keras_ipu.device.autodiff import jvp as _jvp

    return _jvp(fun, primals, tangents, has_aux=has_aux)
