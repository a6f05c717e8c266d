"""Linear-algebra and FFT primitives: kernels against NumPy/hand-computed
references, shape rules against kernel outputs, traced calls with None dims."""

import numpy as np
import pytest

from keras_ipu.device.ir import ShapedArray
from keras_ipu.device.primitives import linalg as lp
from keras_ipu.device.primitives.fft import fft_p
from keras_ipu.device.primitives.shape_rules import ShapeError
from keras_ipu.device.trace import GraphBuilder

RNG = np.random.default_rng(0)


def _outs(prim, *args, **params):
    out = prim.bind(*args, **params)
    return tuple(out) if prim.multiple_results else (out,)


def _check_rule(prim, *args, **params):
    """The shape rule predicts the kernel's outputs exactly; returns them."""
    outs = _outs(prim, *args, **params)
    avals = [ShapedArray(np.shape(a), np.asarray(a).dtype) for a in args]
    predicted = prim.abstract_eval(*avals, **params)
    if not prim.multiple_results:
        predicted = (predicted,)
    assert len(predicted) == len(outs)
    for p, o in zip(predicted, outs):
        assert p.shape == o.shape, (prim, p, o.shape)
        assert p.dtype == o.dtype, (prim, p, o.dtype)
    return [np.asarray(o) for o in outs]


def _traced(prim, shapes_dtypes, **params):
    builder = GraphBuilder()
    args = [builder.new_input(ShapedArray(s, d)) for s, d in shapes_dtypes]
    out = prim.bind(*args, **params)
    return tuple(out) if prim.multiple_results else (out,), builder


def _spd(batch, n, dtype=np.float64):
    a = RNG.standard_normal(batch + (n, n))
    return (a @ np.swapaxes(a, -1, -2) + n * np.eye(n)).astype(dtype)


# ------------------------------------------------------------------ cholesky


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("lower", [True, False])
def test_cholesky_matches_numpy(dtype, lower):
    x = _spd((2, 3), 4, dtype)
    (out,) = _check_rule(lp.cholesky_p, x, lower=lower)
    np.testing.assert_allclose(
        out, np.linalg.cholesky(x, upper=not lower), rtol=1e-5, atol=1e-5
    )


def test_cholesky_float16_computes_in_float32_and_keeps_dtype():
    x = _spd((), 3, np.float16)
    (out,) = _check_rule(lp.cholesky_p, x, lower=True)
    assert out.dtype == np.float16
    ref = np.linalg.cholesky(x.astype(np.float32))
    np.testing.assert_allclose(out.astype(np.float32), ref, rtol=1e-2, atol=1e-2)


def test_cholesky_gives_nan_only_for_the_failing_matrix():
    x = np.stack([_spd((), 3), -np.eye(3)])
    (out,) = _check_rule(lp.cholesky_p, x, lower=True)
    assert np.isfinite(out[0]).all()
    assert np.isnan(out[1]).all()


def test_cholesky_rejects_non_square_and_integers():
    with pytest.raises(ShapeError):
        lp.cholesky_p.abstract_eval(ShapedArray((3, 4), np.float32), lower=True)
    with pytest.raises(TypeError):
        lp.cholesky_p.abstract_eval(ShapedArray((3, 3), np.int32), lower=True)


# ------------------------------------------------------------------ qr / svd


@pytest.mark.parametrize("shape", [(4, 3), (3, 5), (2, 4, 4)])
@pytest.mark.parametrize("mode", ["reduced", "complete"])
def test_qr_reconstructs(shape, mode):
    x = RNG.standard_normal(shape)
    q, r = _check_rule(lp.qr_p, x, mode=mode)
    qn, rn = np.linalg.qr(x, mode=mode)
    np.testing.assert_allclose(q, qn, atol=1e-12)
    np.testing.assert_allclose(q @ r, x, atol=1e-12)
    assert np.allclose(np.tril(r, -1), 0)


@pytest.mark.parametrize("shape", [(4, 3), (3, 5), (2, 3, 4)])
@pytest.mark.parametrize("full", [True, False])
def test_svd_reconstructs(shape, full):
    x = RNG.standard_normal(shape).astype(np.float32)
    u, s, vh = _check_rule(lp.svd_p, x, full_matrices=full, compute_uv=True)
    k = min(shape[-2:])
    rebuilt = (u[..., :, :k] * s[..., None, :]) @ vh[..., :k, :]
    np.testing.assert_allclose(rebuilt, x, atol=1e-5)
    (s_only,) = _check_rule(lp.svd_p, x, full_matrices=full, compute_uv=False)
    np.testing.assert_allclose(s_only, np.linalg.svd(x, compute_uv=False), rtol=1e-5)


def test_svd_of_complex_has_real_singular_values():
    x = RNG.standard_normal((3, 2)) + 1j * RNG.standard_normal((3, 2))
    u, s, vh = _check_rule(
        lp.svd_p, x.astype(np.complex64), full_matrices=False, compute_uv=True
    )
    assert s.dtype == np.float32 and u.dtype == np.complex64
    np.testing.assert_allclose((u * s[None, :]) @ vh, x, atol=1e-5)


# ------------------------------------------------------------------ eigh / eig


def test_eigh_matches_numpy_and_reads_one_triangle():
    x = _spd((2,), 4)
    w, v = _check_rule(lp.eigh_p, x, lower=True)
    np.testing.assert_allclose(w, np.linalg.eigvalsh(x), rtol=1e-10)
    np.testing.assert_allclose((v * w[..., None, :]) @ np.swapaxes(v, -1, -2), x, atol=1e-9)
    garbage_upper = np.tril(x) + np.triu(np.full_like(x, 99.0), 1)
    w2, _ = _check_rule(lp.eigh_p, garbage_upper, lower=True)
    np.testing.assert_allclose(w2, w, rtol=1e-10)


def test_eig_is_always_complex():
    # A symmetric matrix has real eigenvalues; NumPy would return float64,
    # the primitive's dtype must not depend on the values.
    x = _spd((), 3).astype(np.float32)
    w, v = _check_rule(lp.eig_p, x)
    assert w.dtype == np.complex64 and v.dtype == np.complex64
    np.testing.assert_allclose(x @ v, v * w[None, :], atol=1e-4)
    rotation = np.array([[0.0, -1.0], [1.0, 0.0]])
    w, _ = _check_rule(lp.eig_p, rotation)
    np.testing.assert_allclose(sorted(w, key=lambda z: z.imag), [-1j, 1j], atol=1e-12)


# ------------------------------------------------------------------ lu


@pytest.mark.parametrize("shape", [(4, 4), (4, 3), (3, 4), (2, 3, 3, 3)])
def test_lu_reconstructs_with_permutation(shape):
    x = RNG.standard_normal(shape)
    lu, pivots, perm = _check_rule(lp.lu_p, x)
    m, n = shape[-2:]
    k = min(m, n)
    lower = np.tril(lu[..., :, :k], -1) + np.eye(m, k)
    upper = np.triu(lu[..., :k, :])
    np.testing.assert_allclose(
        np.take_along_axis(x, perm[..., :, None], axis=-2), lower @ upper, atol=1e-12
    )
    assert pivots.dtype == np.int32 and perm.dtype == np.int32


def test_lu_pivots_and_permutation_by_hand():
    # Partial pivoting picks the largest |entry| of each column.
    x = np.array([[1.0, 2.0], [3.0, 4.0]])
    lu, pivots, perm = _check_rule(lp.lu_p, x)
    np.testing.assert_array_equal(pivots, [1, 1])
    np.testing.assert_array_equal(perm, [1, 0])
    np.testing.assert_allclose(lu, [[3.0, 4.0], [1 / 3, 2 - 4 / 3]])


def test_lu_of_singular_matrix_has_zero_pivot_and_no_warning():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        lu, _, _ = _check_rule(lp.lu_p, np.full((3, 3), 2.0))
    assert np.min(np.abs(np.diagonal(lu))) == 0.0


# ------------------------------------------------------------------ triangular_solve


@pytest.mark.parametrize("left_side", [True, False])
@pytest.mark.parametrize("lower", [True, False])
@pytest.mark.parametrize("transpose_a", [True, False])
@pytest.mark.parametrize("conjugate_a", [True, False])
@pytest.mark.parametrize("unit_diagonal", [True, False])
def test_triangular_solve_every_mode(left_side, lower, transpose_a, conjugate_a, unit_diagonal):
    n = 3
    raw = RNG.standard_normal((2, n, n)) + 1j * RNG.standard_normal((2, n, n))
    raw += 3 * np.eye(n)
    b = RNG.standard_normal((2, n, 2) if left_side else (2, 2, n)) + 0j
    (x,) = _check_rule(
        lp.triangular_solve_p,
        raw,
        b,
        left_side=left_side,
        lower=lower,
        transpose_a=transpose_a,
        conjugate_a=conjugate_a,
        unit_diagonal=unit_diagonal,
    )
    tri = np.tril(raw) if lower else np.triu(raw)
    if unit_diagonal:
        tri = tri - np.diagonal(tri, axis1=-2, axis2=-1)[..., None] * np.eye(n) + np.eye(n)
    op = np.swapaxes(tri, -1, -2) if transpose_a else tri
    op = np.conj(op) if conjugate_a else op
    np.testing.assert_allclose(op @ x if left_side else x @ op, b, atol=1e-10)


def test_triangular_solve_broadcasts_batch_and_checks_sizes():
    a = np.triu(RNG.standard_normal((3, 3))) + 3 * np.eye(3)
    b = RNG.standard_normal((4, 3, 2))
    params = dict(
        left_side=True,
        lower=False,
        transpose_a=False,
        conjugate_a=False,
        unit_diagonal=False,
    )
    (x,) = _check_rule(lp.triangular_solve_p, a, b, **params)
    np.testing.assert_allclose(a @ x, b, atol=1e-12)
    with pytest.raises(ShapeError):
        lp.triangular_solve_p.abstract_eval(
            ShapedArray((3, 3), np.float32), ShapedArray((4, 2), np.float32), **params
        )


# ------------------------------------------------------------------ fft


@pytest.mark.parametrize(
    "fft_type, lengths, shape, dtype, ref",
    [
        ("FFT", (5,), (2, 5), np.complex64, lambda x: np.fft.fft(x)),
        ("IFFT", (5,), (2, 5), np.complex128, lambda x: np.fft.ifft(x)),
        ("FFT", (3, 4), (2, 3, 4), np.complex128, lambda x: np.fft.fft2(x)),
        ("IFFT", (3, 4), (2, 3, 4), np.complex64, lambda x: np.fft.ifft2(x)),
        ("RFFT", (8,), (2, 8), np.float32, lambda x: np.fft.rfft(x)),
        ("RFFT", (6,), (3, 10), np.float64, lambda x: np.fft.rfft(x, n=6)),
        ("RFFT", (12,), (3, 10), np.float64, lambda x: np.fft.rfft(x, n=12)),
        ("RFFT", (None,), (7,), np.float32, lambda x: np.fft.rfft(x)),
        ("IRFFT", (8,), (2, 5), np.complex64, lambda x: np.fft.irfft(x, n=8)),
        ("IRFFT", (None,), (2, 5), np.complex128, lambda x: np.fft.irfft(x)),
        ("IRFFT", (3,), (4,), np.complex128, lambda x: np.fft.irfft(x, n=3)),
    ],
)
def test_fft_matches_numpy(fft_type, lengths, shape, dtype, ref):
    x = RNG.standard_normal(shape)
    if np.dtype(dtype).kind == "c":
        x = x + 1j * RNG.standard_normal(shape)
    x = x.astype(dtype)
    (out,) = _check_rule(fft_p, x, fft_type=fft_type, fft_lengths=lengths)
    tol = 1e-4 if np.dtype(dtype).itemsize <= 8 else 1e-10
    wide = x.astype(np.complex128 if x.dtype.kind == "c" else np.float64)
    np.testing.assert_allclose(out, ref(wide), atol=tol, rtol=tol)


def test_fft_of_impulse_by_hand():
    x = np.zeros(4, np.complex64)
    x[1] = 1
    (out,) = _check_rule(fft_p, x, fft_type="FFT", fft_lengths=(4,))
    np.testing.assert_allclose(out, [1, -1j, -1, 1j], atol=1e-7)


def test_fft_rejects_wrong_dtypes_and_types():
    with pytest.raises(TypeError):
        fft_p.abstract_eval(ShapedArray((4,), np.float32), fft_type="FFT", fft_lengths=(4,))
    with pytest.raises(TypeError):
        fft_p.abstract_eval(ShapedArray((4,), np.complex64), fft_type="RFFT", fft_lengths=(4,))
    with pytest.raises(ValueError):
        fft_p.abstract_eval(ShapedArray((4,), np.complex64), fft_type="DCT", fft_lengths=(4,))


# ------------------------------------------------------------------ tracing


def test_traced_shapes_with_unknown_dims():
    (q, r), _ = _traced(lp.qr_p, [((None, 5, 3), np.float32)], mode="reduced")
    assert q.shape == (None, 5, 3) and r.shape == (None, 3, 3)
    (u, s, vh), _ = _traced(
        lp.svd_p, [((None, 3, 2), np.float32)], full_matrices=True, compute_uv=True
    )
    assert (u.shape, s.shape, vh.shape) == ((None, 3, 3), (None, 2), (None, 2, 2))
    (lu, piv, perm), _ = _traced(lp.lu_p, [((None, 2, 3), np.float64)])
    assert (lu.shape, piv.shape, perm.shape) == ((None, 2, 3), (None, 2), (None, 2))
    (w, v), _ = _traced(lp.eig_p, [((None, 4, 4), np.float32)])
    assert w.dtype == np.complex64 and v.shape == (None, 4, 4)
    (x,), _ = _traced(
        lp.triangular_solve_p,
        [((None, 4, 4), np.float32), ((None, 4, None), np.float32)],
        left_side=True, lower=True, transpose_a=False, conjugate_a=False, unit_diagonal=False,
    )
    assert x.shape == (None, 4, None)
    (c,), builder = _traced(lp.cholesky_p, [((None, 3, 3), np.float32)], lower=True)
    assert c.shape == (None, 3, 3)
    assert "cholesky" in str(builder.graph)
    (f,), _ = _traced(fft_p, [((None, 10), np.float32)], fft_type="RFFT", fft_lengths=(None,))
    assert f.shape == (None, 6) and f.dtype == np.complex64
    (f,), _ = _traced(fft_p, [((None, None), np.complex64)], fft_type="IRFFT", fft_lengths=(None,))
    assert f.shape == (None, None) and f.dtype == np.float32
    (f,), _ = _traced(fft_p, [((4, None), np.complex64)], fft_type="IRFFT", fft_lengths=(16,))
    assert f.shape == (4, 16)
