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

Gradient rules: grads/linalg.py (registered once every primitive exists).
"""

import warnings

import numpy as np

from keras_ipu.device.ir import ShapedArray
from keras_ipu.device.primitives import cost_util as _cost
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
cholesky_p = Primitive("cholesky", _cholesky_rule, _cholesky, fp_class="checked")


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
qr_p = Primitive("qr", _qr_rule, _qr, multiple_results=True, fp_class="checked")


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
svd_p = Primitive("svd", _svd_rule, _svd, multiple_results=True, fp_class="checked")


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
eigh_p = Primitive("eigh", _eigh_rule, _eigh, multiple_results=True,
                  fp_class="checked")


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
eig_p = Primitive("eig", _eig_rule, _eig, multiple_results=True, fp_class="checked")


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
    fp_class="checked",
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
    "triangular_solve", _triangular_solve_rule, _triangular_solve, fp_class="checked"
)


# -- cost rules (formulas and constants: keras_ipu/device/simulator/cost_model.py)


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
