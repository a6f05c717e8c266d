"""Linear-algebra primitives (as jax.lax.linalg has them).

Every primitive works on the last two axes and batches over the leading
ones. The kernels are LAPACK through NumPy (np.linalg), or SciPy where it is
the right tool (LU factors, triangular solves); SciPy is imported inside the
kernel so that importing the backend stays light. LAPACK has no float16 /
bfloat16 routines: those inputs are computed in float32 and rounded back.

Factorisations never raise on bad values (a compiled program cannot stop
half-way): a matrix that has no Cholesky factor gives NaNs, a singular
matrix gives an LU factor with a zero on its diagonal. The backend turns
those into errors where Keras wants one, eagerly.
"""

import warnings

import numpy as np

from keras_ipu.device.ir import ShapedArray
from keras_ipu.device.primitives import shape_rules
from keras_ipu.device.primitives.registry import Primitive

INDEX_DTYPE = np.dtype(np.int32)


# ---------------------------------------------------------------- helpers


def _matrix_shape(x, name, square=False):
    """Batch shape and (m, n) of a matrix operand; checks what is known."""
    if x.ndim < 2:
        raise shape_rules.ShapeError(
            f"{name}: the operand must have rank >= 2 (a matrix or a batch "
            f"of matrices); got shape {x.shape}."
        )
    m, n = x.shape[-2:]
    if square and m is not None and n is not None and m != n:
        raise shape_rules.ShapeError(
            f"{name}: the last two dimensions must be equal (square "
            f"matrices); got shape {x.shape}."
        )
    if square:
        n = m if m is not None else n
        m = n
    return tuple(x.shape[:-2]), m, n


def _min_dim(a, b):
    if a is None or b is None:
        return None
    return min(a, b)


def _is_float(dtype):
    # ml_dtypes' bfloat16 is a float to us, though NumPy's kind says "V".
    return dtype.kind == "f" or dtype.name == "bfloat16"


def _inexact(x, name):
    if not (_is_float(x.dtype) or x.dtype.kind == "c"):
        raise TypeError(
            f"{name}: the operand must be a float or complex array; got "
            f"{x.dtype}. Cast it first (the backend casts integers to floatx)."
        )


def _real_of(dtype):
    dtype = np.dtype(dtype)
    if dtype.kind == "c":
        return np.dtype(np.float32 if dtype.itemsize == 8 else np.float64)
    return dtype


def _complex_of(dtype):
    dtype = np.dtype(dtype)
    if dtype.kind == "c":
        return dtype
    return np.dtype(np.complex128 if dtype.itemsize == 8 else np.complex64)


def _lapack_input(x):
    """x in a dtype LAPACK has (float16/bfloat16 -> float32)."""
    if _is_float(x.dtype) and x.dtype.itemsize < 4:
        return x.astype(np.float32)
    return x


def _as(dtype, *outs):
    return tuple(np.asarray(o).astype(dtype, copy=False) for o in outs)


# ---------------------------------------------------------------- cholesky


def _cholesky_rule(x, *, lower):
    _inexact(x, "cholesky")
    _matrix_shape(x, "cholesky", square=True)
    return ShapedArray(x.shape, x.dtype)


def _cholesky(x, *, lower):
    a = _lapack_input(x)
    try:
        out = np.linalg.cholesky(a, upper=not lower)
    except np.linalg.LinAlgError:
        # Only the failing matrices of the batch become NaN, as on the
        # device; this slow path runs only for bad inputs.
        out = np.empty_like(a)
        flat_in = a.reshape((-1,) + a.shape[-2:])
        flat_out = out.reshape(flat_in.shape)
        for i, m in enumerate(flat_in):
            try:
                flat_out[i] = np.linalg.cholesky(m, upper=not lower)
            except np.linalg.LinAlgError:
                flat_out[i] = np.nan
    return out.astype(x.dtype, copy=False)


# cholesky(x, lower): the triangular factor L (x = L L^H) or U (x = U^H U).
# Only the lower (upper) triangle of x is read.
cholesky_p = Primitive("cholesky", _cholesky_rule, _cholesky)


# ---------------------------------------------------------------- qr

_QR_MODES = ("reduced", "complete")


def _qr_rule(x, *, mode):
    if mode not in _QR_MODES:
        raise ValueError(f"qr: mode must be one of {_QR_MODES}; got {mode!r}.")
    _inexact(x, "qr")
    batch, m, n = _matrix_shape(x, "qr")
    k = m if mode == "complete" else _min_dim(m, n)
    return (
        ShapedArray(batch + (m, k), x.dtype),
        ShapedArray(batch + (k, n), x.dtype),
    )


def _qr(x, *, mode):
    q, r = np.linalg.qr(_lapack_input(x), mode=mode)
    return _as(x.dtype, q, r)


# qr(x, mode) -> (q, r): x = q r, q with orthonormal columns, r upper
# triangular. mode "reduced": k = min(m, n) columns; "complete": q is m x m.
qr_p = Primitive("qr", _qr_rule, _qr, multiple_results=True)


# ---------------------------------------------------------------- svd


def _svd_rule(x, *, full_matrices, compute_uv):
    _inexact(x, "svd")
    batch, m, n = _matrix_shape(x, "svd")
    k = _min_dim(m, n)
    s = ShapedArray(batch + (k,), _real_of(x.dtype))
    if not compute_uv:
        return (s,)
    u_cols = m if full_matrices else k
    vh_rows = n if full_matrices else k
    return (
        ShapedArray(batch + (m, u_cols), x.dtype),
        s,
        ShapedArray(batch + (vh_rows, n), x.dtype),
    )


def _svd(x, *, full_matrices, compute_uv):
    a = _lapack_input(x)
    if not compute_uv:
        s = np.linalg.svd(a, compute_uv=False)
        return _as(_real_of(x.dtype), s)
    u, s, vh = np.linalg.svd(a, full_matrices=full_matrices)
    return _as(x.dtype, u)[0], _as(_real_of(x.dtype), s)[0], _as(x.dtype, vh)[0]


# svd(x, full_matrices, compute_uv) -> (u, s, vh), or (s,) without uv:
# x = u diag(s) vh, s real and in decreasing order.
svd_p = Primitive("svd", _svd_rule, _svd, multiple_results=True)


# ---------------------------------------------------------------- eigh / eig


def _eigh_rule(x, *, lower):
    _inexact(x, "eigh")
    batch, m, n = _matrix_shape(x, "eigh", square=True)
    return (
        ShapedArray(batch + (n,), _real_of(x.dtype)),
        ShapedArray(batch + (n, n), x.dtype),
    )


def _eigh(x, *, lower):
    w, v = np.linalg.eigh(_lapack_input(x), UPLO="L" if lower else "U")
    return _as(_real_of(x.dtype), w)[0], _as(x.dtype, v)[0]


# eigh(x, lower) -> (w, v): eigenvalues (ascending, real) and eigenvectors
# (columns) of a Hermitian matrix; only its lower (upper) triangle is read.
eigh_p = Primitive("eigh", _eigh_rule, _eigh, multiple_results=True)


def _eig_rule(x):
    _inexact(x, "eig")
    batch, m, n = _matrix_shape(x, "eig", square=True)
    dtype = _complex_of(x.dtype)
    return ShapedArray(batch + (n,), dtype), ShapedArray(batch + (n, n), dtype)


def _eig(x):
    w, v = np.linalg.eig(_lapack_input(x))
    # NumPy returns real arrays when every eigenvalue happens to be real;
    # the primitive's dtype must not depend on values: always complex.
    return _as(_complex_of(x.dtype), w, v)


# eig(x) -> (w, v): eigenvalues and right eigenvectors (columns) of a
# general square matrix, always complex.
eig_p = Primitive("eig", _eig_rule, _eig, multiple_results=True)


# ---------------------------------------------------------------- lu


def _lu_rule(x):
    _inexact(x, "lu")
    batch, m, n = _matrix_shape(x, "lu")
    k = _min_dim(m, n)
    return (
        ShapedArray(x.shape, x.dtype),
        ShapedArray(batch + (k,), INDEX_DTYPE),
        ShapedArray(batch + (m,), INDEX_DTYPE),
    )


def _pivots_to_permutation(pivots, m):
    """Row swaps (LAPACK order: row i with row pivots[i]) as a permutation
    `perm` with x[perm] = L U. One step per pivot, vectorised over the
    batch."""
    batch = pivots.shape[:-1]
    perm = np.broadcast_to(np.arange(m, dtype=INDEX_DTYPE), batch + (m,)).copy()
    flat_perm = perm.reshape(-1, m)
    flat_piv = pivots.reshape(-1, pivots.shape[-1])
    rows = np.arange(flat_perm.shape[0])
    for i in range(flat_piv.shape[-1]):
        j = flat_piv[:, i]
        at_i = flat_perm[:, i].copy()
        flat_perm[:, i] = flat_perm[rows, j]
        flat_perm[rows, j] = at_i
    return perm


def _lu(x):
    from scipy import linalg  # lazy: the first LU pays for the import

    a = _lapack_input(x)
    m = a.shape[-2]
    if a.size == 0:
        k = min(a.shape[-2:])
        pivots = np.zeros(a.shape[:-2] + (k,), INDEX_DTYPE)
    else:
        with warnings.catch_warnings():
            # A singular matrix is a valid input: its U has a zero pivot.
            warnings.simplefilter("ignore", linalg.LinAlgWarning)
            a, pivots = linalg.lu_factor(a, check_finite=False)
    pivots = pivots.astype(INDEX_DTYPE, copy=False)
    perm = _pivots_to_permutation(pivots, m)
    return a.astype(x.dtype, copy=False), pivots, perm


# lu(x) -> (lu, pivots, permutation): partial-pivoting LU, x[perm] = L U with
# L unit lower triangular (below the diagonal of `lu`) and U upper
# triangular (on and above it). pivots are LAPACK's 0-based row swaps.
lu_p = Primitive(
    "lu",
    _lu_rule,
    _lu,
    multiple_results=True,
)


# ---------------------------------------------------------------- triangular_solve


def _triangular_solve_rule(
    a, b, *, left_side, lower, transpose_a, conjugate_a, unit_diagonal
):
    _inexact(a, "triangular_solve")
    shape_rules.same_dtype(a, b)
    a_batch, n, _ = _matrix_shape(a, "triangular_solve", square=True)
    if b.ndim < 2:
        raise shape_rules.ShapeError(
            "triangular_solve: b must have rank >= 2 (add a trailing axis "
            f"to a vector); got shape {b.shape}."
        )
    b_batch = tuple(b.shape[:-2])
    rows, cols = b.shape[-2:]
    solved = rows if left_side else cols
    if n is not None and solved is not None and n != solved:
        side = "b.shape[-2]" if left_side else "b.shape[-1]"
        raise shape_rules.ShapeError(
            f"triangular_solve: {side} must equal the order of a; got "
            f"a.shape={a.shape}, b.shape={b.shape}."
        )
    if solved is None:
        solved = n
    rows, cols = (solved, cols) if left_side else (rows, solved)
    batch = shape_rules.broadcast_shapes(a_batch, b_batch)
    return ShapedArray(batch + (rows, cols), b.dtype)


def _triangular_solve(
    a, b, *, left_side, lower, transpose_a, conjugate_a, unit_diagonal
):
    from scipy import linalg  # lazy: the first solve pays for the import

    dtype = b.dtype
    a, b = _lapack_input(a), _lapack_input(b)
    batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    a = np.broadcast_to(a, batch + a.shape[-2:])
    b = np.broadcast_to(b, batch + b.shape[-2:])
    if not left_side:
        # x op(a) = b  <=>  op(a)^T x^T = b^T
        b = np.swapaxes(b, -1, -2)
        transpose_a = not transpose_a
    # scipy has op(a) in {a, a^T, a^H}; conj(a) alone is a solve with a on
    # conjugated data.
    conj_data = conjugate_a and not transpose_a
    if conj_data:
        b = np.conj(b)
    trans = 0
    if transpose_a:
        trans = 2 if conjugate_a else 1
    if b.size == 0:
        x = np.zeros(b.shape, b.dtype)
    else:
        x = linalg.solve_triangular(
            a,
            b,
            trans=trans,
            lower=lower,
            unit_diagonal=unit_diagonal,
            check_finite=False,
        )
    if conj_data:
        x = np.conj(x)
    if not left_side:
        x = np.swapaxes(x, -1, -2)
    return np.ascontiguousarray(x).astype(dtype, copy=False)


# triangular_solve(a, b): x with op(a) x = b (left_side) or x op(a) = b,
# op(a) = a, a^T or a^H (transpose_a, conjugate_a); only the lower (upper)
# triangle of a is read, its diagonal taken as ones if unit_diagonal.
triangular_solve_p = Primitive(
    "triangular_solve", _triangular_solve_rule, _triangular_solve
)


# -- gradient rules (contract: keras_ipu/device/autodiff.py) -----------------


def _tri_mask(n, lower, dtype, unit_diagonal=False):
    """The constant 0/1 mask of the triangle a primitive reads."""
    mask = np.tril(np.ones((n, n), bool)) if lower else np.triu(
        np.ones((n, n), bool))
    if unit_diagonal:
        mask &= ~np.eye(n, dtype=bool)
    return mask.astype(dtype)


def _order(a, name):
    n = a.shape[-1]
    if n is None:
        raise NotImplementedError(
            f"The gradient of {name} needs the matrix size; got shape "
            f"{a.shape}."
        )
    return n


def _triangular_solve_grad(cts, inputs, outputs, *, left_side, lower,
                           transpose_a, conjugate_a, unit_diagonal):
    from keras_ipu.device.primitives import ad_util
    from keras_ipu.device.primitives import elementwise as ew

    (g,), (a, b), (x,) = cts, inputs, outputs
    params = dict(left_side=left_side, lower=lower, conjugate_a=conjugate_a,
                  unit_diagonal=unit_diagonal)
    # x = op(a)^-1 b is linear in b: its transpose solves with op(a)^T.
    b_ct = triangular_solve_p.bind(a, g, transpose_a=not transpose_a,
                                   **params)
    # d op(a) contributes -op(a)^-1 d op(a) x: op(a)'s cotangent is
    # -b_ct x^T (left side) or -x^T b_ct (right side).
    if left_side:
        op_ct = ad_util.matmul(b_ct, ad_util.matrix_transpose(x))
    else:
        op_ct = ad_util.matmul(ad_util.matrix_transpose(x), b_ct)
    op_ct = ew.neg_p.bind(op_ct)
    if transpose_a:
        op_ct = ad_util.matrix_transpose(op_ct)
    if conjugate_a:
        op_ct = ew.conj_p.bind(op_ct)
    n = _order(a, "triangular_solve")
    a_ct = ew.mul_p.bind(op_ct, _tri_mask(n, lower, op_ct.dtype,
                                          unit_diagonal))
    return [ad_util.unbroadcast(a_ct, a.shape),
            ad_util.unbroadcast(b_ct, b.shape)]


def _cholesky_grad(cts, inputs, outputs, *, lower):
    """x's lower (upper) triangle defines A = sym(x) = L L^T. With
    P = Phi(L^T L_ct) (lower triangle, halved diagonal) and
    S = L^-T P L^-1, the cotangent of the read triangle is S + S^T with
    the diagonal counted once."""
    from keras_ipu.device.primitives import ad_util
    from keras_ipu.device.primitives import elementwise as ew

    (g,), (x,), (c,) = cts, inputs, outputs
    if x.dtype.kind == "c":
        raise NotImplementedError(
            "The gradient of cholesky for complex matrices is not "
            "implemented yet.")
    n = _order(x, "cholesky")
    l, l_ct = (c, g) if lower else (
        ad_util.matrix_transpose(c), ad_util.matrix_transpose(g))
    phi = np.tril(np.ones((n, n))) - 0.5 * np.eye(n)
    p = ew.mul_p.bind(ad_util.matmul(ad_util.matrix_transpose(l), l_ct),
                      phi.astype(l.dtype))
    solve = dict(lower=True, conjugate_a=False, unit_diagonal=False)
    tmp = triangular_solve_p.bind(l, p, left_side=True, transpose_a=True,
                                  **solve)
    s = triangular_solve_p.bind(l, tmp, left_side=False, transpose_a=False,
                                **solve)
    sym = ew.add_p.bind(s, ad_util.matrix_transpose(s))
    x_ct = ew.mul_p.bind(sym, phi.astype(sym.dtype))
    if not lower:
        x_ct = ad_util.matrix_transpose(x_ct)
    return [x_ct]


triangular_solve_p.grad = _triangular_solve_grad
cholesky_p.grad = _cholesky_grad


def _read_triangle_ct(a_bar, n, lower):
    """Cotangent of the triangle a primitive reads, from the cotangent
    a_bar of the symmetric matrix it stands for: off-diagonal entries
    appear twice in that matrix, diagonal ones once."""
    from keras_ipu.device.primitives import ad_util
    from keras_ipu.device.primitives import elementwise as ew

    sym = ew.add_p.bind(a_bar, ad_util.matrix_transpose(a_bar))
    weight = _tri_mask(n, lower, np.float64) - 0.5 * np.eye(n)
    return ew.mul_p.bind(sym, weight.astype(sym.dtype))


def _eigh_grad(cts, inputs, outputs, *, lower):
    """A = V diag(w) V^T: A_ct = V (diag(w_ct) + F o (V^T V_ct)) V^T with
    F_ij = 1 / (w_j - w_i) off the diagonal (distinct eigenvalues)."""
    from keras_ipu.device.primitives import ad_util
    from keras_ipu.device.primitives import elementwise as ew
    from keras_ipu.device.primitives.structure import reshape_p

    (w_ct, v_ct), (x,), (w, v) = cts, inputs, outputs
    if x.dtype.kind == "c":
        raise NotImplementedError(
            "The gradient of eigh for complex matrices is not implemented "
            "yet.")
    n = _order(x, "eigh")
    eye = np.eye(n, dtype=bool)
    inner = None
    if v_ct is not None:
        w_row = reshape_p.bind(w, new_shape=tuple(w.shape[:-1]) + (1, n))
        w_col = reshape_p.bind(w, new_shape=tuple(w.shape[:-1]) + (n, 1))
        gap = ew.sub_p.bind(w_row, w_col)
        one = np.ones((), gap.dtype)
        zero = np.zeros((), gap.dtype)
        f = ew.select_p.bind(
            eye, zero, ew.reciprocal_p.bind(ew.select_p.bind(eye, one, gap)))
        inner = ew.mul_p.bind(
            f, ad_util.matmul(ad_util.matrix_transpose(v), v_ct))
    if w_ct is not None:
        diag = ew.mul_p.bind(
            reshape_p.bind(w_ct, new_shape=tuple(w_ct.shape[:-1]) + (1, n)),
            np.eye(n, dtype=w_ct.dtype))
        inner = ad_util.add_any(inner, diag)
    a_bar = ad_util.matmul(ad_util.matmul(v, inner),
                           ad_util.matrix_transpose(v))
    return [_read_triangle_ct(a_bar, n, lower)]


def _qr_grad(cts, inputs, outputs, *, mode):
    """For m >= n (q: m x n): M = R R_ct^T - Q_ct^T Q,
    A_ct = (Q_ct + Q copyltu(M)) R^-T, copyltu mirroring M's lower
    triangle onto its upper one."""
    from keras_ipu.device.primitives import ad_util
    from keras_ipu.device.primitives import elementwise as ew

    (q_ct, r_ct), (x,), (q, r) = cts, inputs, outputs
    m, n = x.shape[-2], x.shape[-1]
    if x.dtype.kind == "c" or m is None or n is None or m < n or (
            mode == "complete" and m != n):
        raise NotImplementedError(
            "The gradient of qr is implemented for real matrices with at "
            f"least as many rows as columns (reduced mode); got shape "
            f"{x.shape}, mode={mode!r}.")
    q_ct = ad_util.zeros_like(q) if q_ct is None else q_ct
    r_ct = ad_util.zeros_like(r) if r_ct is None else r_ct
    t = ad_util.matrix_transpose
    big = ew.sub_p.bind(ad_util.matmul(r, t(r_ct)),
                        ad_util.matmul(t(q_ct), q))
    low = np.tril(np.ones((n, n)), -1).astype(big.dtype)
    diag = np.eye(n, dtype=big.dtype)
    strict = ew.mul_p.bind(big, low)
    copyltu = ew.add_p.bind(
        ew.add_p.bind(strict, t(strict)), ew.mul_p.bind(big, diag))
    b = ew.add_p.bind(q_ct, ad_util.matmul(q, copyltu))
    a_ct = triangular_solve_p.bind(
        r, b, left_side=False, lower=False, transpose_a=True,
        conjugate_a=False, unit_diagonal=False)
    return [a_ct]


eigh_p.grad = _eigh_grad
qr_p.grad = _qr_grad


def _svd_grad(cts, inputs, outputs, *, full_matrices, compute_uv):
    """Real A = U S V^T (Townsend, "Differentiating the singular value
    decomposition", 2016), with F_ij = 1 / (s_j^2 - s_i^2) off the diagonal
    (distinct singular values):
      A_ct = U [ (F o (U^T U_ct - U_ct^T U)) S + diag(s_ct)
                 + S (F o (V^T V_ct - V_ct^T V)) ] V^T
             + (I - U U^T) U_ct S^-1 V^T + U S^-1 V_ct^T (I - V V^T)."""
    from keras_ipu.device.primitives import ad_util
    from keras_ipu.device.primitives import elementwise as ew
    from keras_ipu.device.primitives.structure import reshape_p

    (x,) = inputs
    m, n = x.shape[-2], x.shape[-1]
    if x.dtype.kind == "c" or m is None or n is None or (
            full_matrices and compute_uv and m != n):
        raise NotImplementedError(
            "The gradient of svd is implemented for real matrices of known "
            "size (full_matrices only for square ones); got "
            f"{x.short() if hasattr(x, 'short') else x.shape}.")
    if compute_uv:
        u_ct, s_ct, vh_ct = cts
        u, s, vh = outputs
    else:
        (s_ct,) = cts
        u_ct = vh_ct = None
        u, s, vh = svd_p.bind(x, full_matrices=False, compute_uv=True)
    k = min(m, n)
    t = ad_util.matrix_transpose
    mm = ad_util.matmul
    v = t(vh)
    eye = np.eye(k, dtype=bool)
    batch = tuple(s.shape[:-1])
    s_row = reshape_p.bind(s, new_shape=batch + (1, k))
    s_col = reshape_p.bind(s, new_shape=batch + (k, 1))
    gap = ew.sub_p.bind(ew.mul_p.bind(s_row, s_row), ew.mul_p.bind(s_col, s_col))
    one = np.ones((), s.dtype)
    zero = np.zeros((), s.dtype)
    f = ew.select_p.bind(
        eye, zero, ew.reciprocal_p.bind(ew.select_p.bind(eye, one, gap)))
    s_inv_row = ew.reciprocal_p.bind(s_row)  # scales columns: X S^-1
    core = None
    rest = None
    if s_ct is not None:
        core = ew.mul_p.bind(
            reshape_p.bind(s_ct, new_shape=batch + (1, k)),
            np.eye(k, dtype=s.dtype))
    if u_ct is not None:
        ut_uct = mm(t(u), u_ct)
        j = ew.mul_p.bind(f, ew.sub_p.bind(ut_uct, t(ut_uct)))
        core = ad_util.add_any(core, ew.mul_p.bind(j, s_row))
        if m > k:
            proj = ew.sub_p.bind(u_ct, mm(u, ut_uct))
            rest = ad_util.add_any(rest, mm(ew.mul_p.bind(proj, s_inv_row),
                                            vh))
    if vh_ct is not None:
        v_ct = t(vh_ct)
        vt_vct = mm(vh, v_ct)
        j = ew.mul_p.bind(f, ew.sub_p.bind(vt_vct, t(vt_vct)))
        core = ad_util.add_any(core, ew.mul_p.bind(s_col, j))
        if n > k:
            proj = ew.sub_p.bind(v_ct, mm(v, vt_vct))
            rest = ad_util.add_any(rest, mm(ew.mul_p.bind(u, s_inv_row),
                                            t(proj)))
    a_ct = None if core is None else mm(mm(u, core), vh)
    return [ad_util.add_any(a_ct, rest)]


def _lu_grad(cts, inputs, outputs):
    """Square x[perm] = L U packed in one matrix. With X = L^-1 P dx U^-1,
    d(packed) = L tril(X, -1) + triu(X) U, so
    X_ct = tril(L^T C, -1) + triu(C U^T) and x_ct = P^T L^-T X_ct U^-T."""
    from keras_ipu.device.primitives import ad_util
    from keras_ipu.device.primitives import elementwise as ew
    from keras_ipu.device.primitives.indexing import scatter_p
    from keras_ipu.device.primitives.structure import reshape_p

    (c, _, _), (x,), (packed, _, perm) = cts, inputs, outputs
    m, n = x.shape[-2], x.shape[-1]
    if x.dtype.kind == "c" or m is None or m != n:
        raise NotImplementedError(
            "The gradient of lu is implemented for real square matrices; got "
            f"shape {x.shape}.")
    if c is None:
        return [None]
    t = ad_util.matrix_transpose
    mm = ad_util.matmul
    strict = np.tril(np.ones((n, n)), -1).astype(packed.dtype)
    upper = np.triu(np.ones((n, n))).astype(packed.dtype)
    l = ew.add_p.bind(ew.mul_p.bind(packed, strict), np.eye(n, dtype=packed.dtype))
    u = ew.mul_p.bind(packed, upper)
    x_ct = ew.add_p.bind(ew.mul_p.bind(mm(t(l), c), strict),
                         ew.mul_p.bind(mm(c, t(u)), upper))
    solve = dict(conjugate_a=False)
    y = triangular_solve_p.bind(l, x_ct, left_side=True, lower=True,
                                transpose_a=True, unit_diagonal=True, **solve)
    y = triangular_solve_p.bind(u, y, left_side=False, lower=False,
                                transpose_a=True, unit_diagonal=False, **solve)
    # Row i of y belongs to row perm[i] of x.
    idx = reshape_p.bind(perm, new_shape=tuple(perm.shape) + (1,))
    return [scatter_p.bind(ad_util.zeros_like(x), idx, y, mode="add",
                           batch_dims=x.ndim - 2)]


svd_p.grad = _svd_grad
lu_p.grad = _lu_grad


def _solve_transposed(v, b):
    """y with v^T y = b, through v's LU factors: v = P^T L U, so
    v^T = U^T L^T P."""
    from keras_ipu.device.primitives import ad_util
    from keras_ipu.device.primitives.indexing import scatter_p
    from keras_ipu.device.primitives.structure import reshape_p

    packed, _, perm = lu_p.bind(v)
    solve = dict(left_side=True, transpose_a=True, conjugate_a=False)
    z = triangular_solve_p.bind(packed, b, lower=False, unit_diagonal=False,
                                **solve)
    z = triangular_solve_p.bind(packed, z, lower=True, unit_diagonal=True,
                                **solve)
    # Row i of z is row perm[i] of y.
    idx = reshape_p.bind(perm, new_shape=tuple(perm.shape) + (1,))
    return scatter_p.bind(ad_util.zeros_like(b), idx, z, mode="add",
                          batch_dims=b.ndim - 2)


def _eig_grad(cts, inputs, outputs):
    """A = V diag(w) V^-1 with distinct eigenvalues and unit-norm columns.
    With X = V^-1 dA V: dw = diag(X); the unnormalised dU = V (F o X),
    F_ij = 1 / (w_j - w_i) off the diagonal, and the unit-norm constraint
    gives dv_j = du_j - v_j Re(v_j^H du_j) (the phase of each column is a
    convention: only phase-invariant functions of v have a gradient).
    Transposed: U_ct = V_ct - conj(V) diag(Re(sum_i V_ct o V)),
    X_ct = diag(w_ct) + F o (V^T U_ct), A_ct = V^-T X_ct V^T (its real part
    for a real A)."""
    from keras_ipu.device.primitives import ad_util
    from keras_ipu.device.primitives import elementwise as ew
    from keras_ipu.device.primitives import reduce
    from keras_ipu.device.primitives.structure import reshape_p

    (w_ct, v_ct), (x,), (w, v) = cts, inputs, outputs
    n = _order(x, "eig")
    batch = tuple(w.shape[:-1])
    t = ad_util.matrix_transpose
    x_ct = None
    if v_ct is not None:
        s = ew.real_p.bind(reduce.reduce_sum_p.bind(
            ew.mul_p.bind(v_ct, v), axes=(v.ndim - 2,)))
        s = ad_util.convert(reshape_p.bind(s, new_shape=batch + (1, n)),
                            v.dtype)
        u_ct = ew.sub_p.bind(v_ct, ew.mul_p.bind(ew.conj_p.bind(v), s))
        eye = np.eye(n, dtype=bool)
        gap = ew.sub_p.bind(reshape_p.bind(w, new_shape=batch + (1, n)),
                            reshape_p.bind(w, new_shape=batch + (n, 1)))
        one = np.ones((), gap.dtype)
        zero = np.zeros((), gap.dtype)
        f = ew.select_p.bind(
            eye, zero, ew.reciprocal_p.bind(ew.select_p.bind(eye, one, gap)))
        x_ct = ew.mul_p.bind(f, ad_util.matmul(t(v), u_ct))
    if w_ct is not None:
        diag = ew.mul_p.bind(reshape_p.bind(w_ct, new_shape=batch + (1, n)),
                             np.eye(n, dtype=w_ct.dtype))
        x_ct = ad_util.add_any(x_ct, diag)
    if x_ct is None:
        return [None]
    a_ct = _solve_transposed(v, ad_util.matmul(x_ct, t(v)))
    if x.dtype.kind != "c":
        a_ct = ad_util.convert(ew.real_p.bind(a_ct), x.dtype)
    return [a_ct]


eig_p.grad = _eig_grad


# -- cost rules (formulas and constants: keras_ipu/device/simulator/cost_model.py)
from keras_ipu.device.primitives import cost_util as _cost  # noqa: E402


def _matrices(aval):
    """(batch count, rows, cols) of a stack of matrices."""
    m, n = (aval.shape[-2] or 0), (aval.shape[-1] or 0)
    return (_cost.size(aval) // (m * n) if m * n else 0), m, n


def _flops(per_matrix):
    # FLOP counts of the standard dense algorithms (Golub & Van Loan, Matrix
    # Computations, table of operation counts), per matrix, times the batch.
    def rule(ins, outs, **params):
        b, m, n = _matrices(ins[0])
        return b * per_matrix(m, n, ins, **params)

    return _cost.per_output("linalg", rule)


cholesky_p.cost = _flops(lambda m, n, ins, **p: n**3 / 3)
qr_p.cost = _flops(lambda m, n, ins, **p: 2 * m * n * n - 2 * min(m, n) ** 3 / 3)
svd_p.cost = _flops(
    lambda m, n, ins, *, full_matrices, compute_uv: (
        4 * m * m * n + 8 * m * n * n + 9 * n**3 if compute_uv
        else 4 * m * n * n - 4 * n**3 / 3
    )
)
eigh_p.cost = _flops(lambda m, n, ins, **p: 9 * n**3)
eig_p.cost = _flops(lambda m, n, ins, **p: 25 * n**3)
lu_p.cost = _flops(lambda m, n, ins, **p: m * n * n - n**3 / 3)


def _triangular_solve_flops(ins, outs, *, left_side, **params):
    # One multiply-add per (triangle entry x right-hand side).
    b, m, _ = _matrices(ins[0])
    rhs = _cost.size(ins[1]) // max(b * m, 1)
    return b * m * m * rhs


triangular_solve_p.cost = _cost.per_output("linalg", _triangular_solve_flops)
