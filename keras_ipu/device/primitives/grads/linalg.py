"""Gradient rules of the primitives of primitives/linalg.py (contract:
keras_ipu/device/autodiff/__init__.py), registered when the primitive set
is imported (primitives/__init__.py), after every primitive is declared."""

import numpy as np

from keras_ipu.device.primitives import ad_util
from keras_ipu.device.primitives import elementwise as ew
from keras_ipu.device.primitives import reduce
from keras_ipu.device.primitives.indexing import scatter_p
from keras_ipu.device.primitives.linalg import cholesky_p
from keras_ipu.device.primitives.linalg import eig_p
from keras_ipu.device.primitives.linalg import eigh_p
from keras_ipu.device.primitives.linalg import lu_p
from keras_ipu.device.primitives.linalg import qr_p
from keras_ipu.device.primitives.linalg import svd_p
from keras_ipu.device.primitives.linalg import triangular_solve_p
from keras_ipu.device.primitives.structure import reshape_p


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
    sym = ew.add_p.bind(a_bar, ad_util.matrix_transpose(a_bar))
    weight = _tri_mask(n, lower, np.float64) - 0.5 * np.eye(n)
    return ew.mul_p.bind(sym, weight.astype(sym.dtype))


def _eigh_grad(cts, inputs, outputs, *, lower):
    """A = V diag(w) V^T: A_ct = V (diag(w_ct) + F o (V^T V_ct)) V^T with
    F_ij = 1 / (w_j - w_i) off the diagonal (distinct eigenvalues)."""
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
