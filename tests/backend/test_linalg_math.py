"""The backend's linalg and math ops against NumPy/SciPy, eagerly and traced
(compute_output_spec with unknown dimensions)."""

import numpy as np
import pytest
import scipy.signal
import scipy.special

import keras  # noqa: F401  (selects the ipu backend first)
from keras.src.backend.common.keras_tensor import KerasTensor

from keras_ipu.backend import core
from keras_ipu.backend import linalg
from keras_ipu.backend import math as kmath
from keras_ipu.backend.numpy import slogdet

RNG = np.random.default_rng(1)


def _np(x):
    return np.asarray(x)


def _spec(fn, *shapes, dtype="float32", **kwargs):
    args = [KerasTensor(s, dtype=dtype) for s in shapes]
    return core.compute_output_spec(lambda *a: fn(*a, **kwargs), *args)


def _spd(batch, n):
    a = RNG.standard_normal(batch + (n, n))
    return a @ np.swapaxes(a, -1, -2) + n * np.eye(n)


# ------------------------------------------------------------------ linalg


def test_det_and_slogdet_match_numpy_with_odd_permutations():
    x = RNG.standard_normal((6, 4, 4))
    np.testing.assert_allclose(_np(linalg.det(x)), np.linalg.det(x), rtol=1e-10)
    sign, logabs = slogdet(x)
    ref_sign, ref_log = np.linalg.slogdet(x)
    np.testing.assert_array_equal(_np(sign), ref_sign)
    np.testing.assert_allclose(_np(logabs), ref_log, rtol=1e-10)
    # Swapping two rows flips the sign: det [[0,1],[1,0]] = -1.
    assert float(linalg.det(np.array([[0.0, 1.0], [1.0, 0.0]]))) == -1.0


def test_slogdet_of_singular_matrix_is_zero_and_minus_inf():
    sign, logabs = slogdet(np.full((4, 4), 2.0))
    assert float(sign) == 0.0 and float(logabs) == -np.inf


def test_integer_input_is_computed_in_float32():
    out = linalg.det(np.array([[2, 1], [1, 3]], dtype="int32"))
    assert out.dtype == np.float32 and float(out) == pytest.approx(5.0)


def test_inv_solve_and_solve_triangular():
    a = RNG.standard_normal((3, 4, 4)) + 4 * np.eye(4)
    np.testing.assert_allclose(_np(linalg.inv(a)), np.linalg.inv(a), rtol=1e-9, atol=1e-12)
    b = RNG.standard_normal((3, 4, 2))
    np.testing.assert_allclose(_np(linalg.solve(a, b)), np.linalg.solve(a, b), rtol=1e-9)
    v = RNG.standard_normal((3, 4))
    np.testing.assert_allclose(
        _np(linalg.solve(a, v)), np.linalg.solve(a, v[..., None])[..., 0], rtol=1e-9
    )
    # One matrix, a batch of right-hand sides.
    np.testing.assert_allclose(
        _np(linalg.solve(a[0], b)), np.linalg.solve(a[0], b), rtol=1e-9
    )
    upper = np.triu(a)
    np.testing.assert_allclose(
        _np(linalg.solve_triangular(upper, b)), np.linalg.solve(upper, b), rtol=1e-9
    )
    np.testing.assert_allclose(
        _np(linalg.solve_triangular(a, v, lower=True)),
        np.linalg.solve(np.tril(a), v[..., None])[..., 0],
        rtol=1e-9,
    )


def test_cholesky_and_its_error():
    x = _spd((2,), 3)
    np.testing.assert_allclose(_np(linalg.cholesky(x)), np.linalg.cholesky(x), rtol=1e-12)
    np.testing.assert_allclose(
        _np(linalg.cholesky(x, upper=True)), np.linalg.cholesky(x, upper=True), rtol=1e-12
    )
    with pytest.raises(ValueError, match="positive-definite"):
        linalg.cholesky(-np.eye(3))


@pytest.mark.parametrize("upper", [False, True])
def test_cholesky_inverse(upper):
    x = _spd((2,), 4)
    factor = np.linalg.cholesky(x, upper=upper)
    np.testing.assert_allclose(
        _np(linalg.cholesky_inverse(factor, upper=upper)), np.linalg.inv(x), rtol=1e-9
    )


def test_decompositions_reconstruct():
    x = RNG.standard_normal((2, 5, 3))
    q, r = linalg.qr(x)
    np.testing.assert_allclose(_np(q) @ _np(r), x, atol=1e-12)
    u, s, vh = linalg.svd(x, full_matrices=False)
    np.testing.assert_allclose((_np(u) * _np(s)[..., None, :]) @ _np(vh), x, atol=1e-12)
    np.testing.assert_allclose(_np(linalg.svd(x, compute_uv=False)), _np(s), rtol=1e-12)
    sym = _spd((2,), 3)
    w, v = linalg.eigh(sym)
    np.testing.assert_allclose(_np(w), np.linalg.eigvalsh(sym), rtol=1e-12)
    w, v = linalg.eig(sym)
    assert _np(w).dtype == np.complex128
    np.testing.assert_allclose(sym @ _np(v), _np(v) * _np(w)[..., None, :], atol=1e-10)
    lu, piv = linalg.lu_factor(x[0])
    assert _np(piv).shape == (3,) and _np(lu).shape == (5, 3)
    with pytest.raises(ValueError, match="reduced"):
        linalg.qr(x, mode="r")


@pytest.mark.parametrize("shape", [(7, 4), (4, 7), (5, 5)])
def test_pinv_and_lstsq(shape):
    a = RNG.standard_normal(shape)
    np.testing.assert_allclose(_np(linalg.pinv(a)), np.linalg.pinv(a), atol=1e-10)
    b = RNG.standard_normal((shape[0],))
    np.testing.assert_allclose(
        _np(linalg.lstsq(a, b)), np.linalg.lstsq(a, b)[0], atol=1e-10
    )
    b2 = RNG.standard_normal((shape[0], 3))
    np.testing.assert_allclose(
        _np(linalg.lstsq(a, b2, rcond=1e-3)), np.linalg.lstsq(a, b2, rcond=1e-3)[0], atol=1e-10
    )


def test_pinv_drops_small_singular_values():
    # diag(2, 1e-20): the tiny value is below rcond * 2 and is dropped.
    out = _np(linalg.pinv(np.diag([2.0, 1e-20])))
    np.testing.assert_allclose(out, np.diag([0.5, 0.0]))


def test_matrix_rank():
    u, v = RNG.standard_normal((5, 1)), RNG.standard_normal((1, 4))
    assert int(linalg.matrix_rank(u @ v)) == 1
    out = linalg.matrix_rank(RNG.standard_normal((3, 4, 4)))
    assert out.dtype == np.int32
    np.testing.assert_array_equal(_np(out), [4, 4, 4])
    near = np.array([[1.0, 2.0], [2.0, 4.000001]])
    assert int(linalg.matrix_rank(near, tol=1e-2)) == 1
    with pytest.raises(ValueError):
        linalg.matrix_rank(np.ones(3))


@pytest.mark.parametrize("ord", [None, "fro", "nuc", np.inf, -np.inf, 1, -1, 2, -2])
@pytest.mark.parametrize("axis", [None, (0, 1), (2, 0)])
def test_matrix_norms(ord, axis):
    x = RNG.standard_normal((4, 5, 3)) if axis else RNG.standard_normal((4, 5))
    for keepdims in (False, True):
        np.testing.assert_allclose(
            _np(linalg.norm(x, ord=ord, axis=axis, keepdims=keepdims)),
            np.linalg.norm(x, ord=ord, axis=axis, keepdims=keepdims),
            rtol=1e-10,
        )


@pytest.mark.parametrize("ord", [None, np.inf, -np.inf, 0, 1, -1, 2, -2, 3, 0.5])
def test_vector_norms(ord):
    x = RNG.standard_normal((4, 5))
    x[0, 0] = 0.0
    np.testing.assert_allclose(
        _np(linalg.norm(x, ord=ord, axis=-1)), np.linalg.norm(x, ord=ord, axis=-1), rtol=1e-10
    )


def test_norm_errors_and_dtypes():
    x = np.ones((2, 3), "float32")
    for ord, axis in [("fro", 1), (0, None), (3, (0, 1))]:
        with pytest.raises(ValueError):
            linalg.norm(x, ord=ord, axis=axis)
    with pytest.raises(ValueError):
        linalg.norm(x, axis=2)
    assert linalg.norm(np.ones((3,), "int32")).dtype == np.float32
    assert linalg.norm(np.ones((3,), "float16")).dtype == np.float16
    z = np.array([3 + 4j], np.complex64)
    out = linalg.norm(z)
    assert out.dtype == np.float32 and float(out) == pytest.approx(5.0)


def test_jvp_of_python_scalars():
    out, tangent = linalg.jvp(lambda x: x * x * x, (2.0,), (0.5,))
    np.testing.assert_allclose(np.asarray(out), 8.0)
    np.testing.assert_allclose(np.asarray(tangent), 3 * 4.0 * 0.5)


def test_linalg_traces_with_unknown_batch():
    assert _spec(linalg.det, (None, 3, 3)).shape == (None,)
    assert _spec(linalg.inv, (None, 3, 3)).shape == (None, 3, 3)
    assert _spec(linalg.solve, (None, 3, 3), (None, 3)).shape == (None, 3)
    assert _spec(linalg.solve, (None, 3, 3), (None, 3, 2)).shape == (None, 3, 2)
    assert _spec(linalg.solve_triangular, (None, 3, 3), (None, 3, 5)).shape == (None, 3, 5)
    assert _spec(linalg.cholesky, (None, 3, 3)).shape == (None, 3, 3)
    assert _spec(linalg.cholesky_inverse, (None, 3, 3)).shape == (None, 3, 3)
    assert _spec(linalg.pinv, (None, 4, 3)).shape == (None, 3, 4)
    rank = _spec(linalg.matrix_rank, (None, 4, 3))
    assert rank.shape == (None,) and rank.dtype == "int32"
    assert _spec(linalg.norm, (None, 4, 3), ord="nuc", axis=(1, 2)).shape == (None,)
    assert _spec(linalg.norm, (None, 4, 3), axis=1, keepdims=True).shape == (None, 1, 3)
    sign, logabs = _spec(slogdet, (None, 3, 3))
    assert logabs.shape == (None,)
    assert _spec(linalg.lstsq, (5, 3), (5,)).shape == (3,)


# ------------------------------------------------------------------ math


@pytest.mark.parametrize(
    "op, fn, empty",
    [
        (kmath.segment_sum, np.add, 0.0),
        (kmath.segment_max, np.maximum, -np.inf),
        (kmath.segment_min, np.minimum, np.inf),
        (kmath.segment_prod, np.multiply, 1.0),
    ],
)
def test_segment_reductions(op, fn, empty):
    data = RNG.standard_normal((7, 2)).astype("float32")
    ids = np.array([0, 2, 2, -1, 0, 4, 2], "int32")
    out = _np(op(data, ids, num_segments=6))
    ref = np.full((6, 2), empty, "float32")
    for i, s in enumerate(ids):
        if s >= 0:
            ref[s] = fn(ref[s], data[i])
    np.testing.assert_allclose(out, ref, rtol=1e-6)
    # Eagerly the number of segments may come from the ids.
    assert _np(op(data, ids)).shape == (5, 2)


def test_segment_sum_traces_with_num_segments_only():
    spec = _spec(kmath.segment_sum, (None, 4), (None,), num_segments=3)
    assert spec.shape == (3, 4)
    spec = _spec(kmath.segment_max, (None, None), (None,), num_segments=3)
    assert spec.shape == (3, None)
    with pytest.raises(ValueError, match="num_segments"):
        _spec(kmath.segment_sum, (None, 4), (None,))


def test_top_k_and_in_top_k():
    x = np.array([[0.0, 4.0, 2.0, 1.0, 3.0]], "float32")
    values, indices = kmath.top_k(x, 2)
    np.testing.assert_array_equal(_np(values), [[4.0, 3.0]])
    np.testing.assert_array_equal(_np(indices), [[1, 4]])
    assert _np(indices).dtype == np.int32
    preds = np.array([[0.1, 0.9, 0.8, 0.8], [0.95, 0.95, 0.0, 0.95], [0.1, np.nan, 0.5, 0.2]])
    targets = np.array([2, 0, 1])
    np.testing.assert_array_equal(_np(kmath.in_top_k(targets, preds, 1)), [False, True, False])
    np.testing.assert_array_equal(_np(kmath.in_top_k(targets, preds, 2)), [True, True, False])
    spec = _spec(lambda t, p: kmath.in_top_k(t, p, 1), (None,), (None, 4))
    assert spec.shape == (None,) and spec.dtype == "bool"


def test_logsumexp():
    x = RNG.standard_normal((3, 4))
    for axis in (None, 0, 1, (0, 1)):
        for keepdims in (False, True):
            np.testing.assert_allclose(
                _np(kmath.logsumexp(x, axis=axis, keepdims=keepdims)),
                scipy.special.logsumexp(x, axis=axis, keepdims=keepdims),
                rtol=1e-12,
            )
    big = np.array([1000.0, 1000.0])
    assert float(kmath.logsumexp(big)) == pytest.approx(1000.0 + np.log(2.0))
    assert float(kmath.logsumexp(np.array([-np.inf, -np.inf]))) == -np.inf
    assert _spec(kmath.logsumexp, (None, 2, 3), axis=1).shape == (None, 3)


def test_cdist():
    x, y = RNG.standard_normal((2, 4, 3)), RNG.standard_normal((2, 5, 3))
    ref = np.sqrt(((x[:, :, None] - y[:, None]) ** 2).sum(-1))
    np.testing.assert_allclose(_np(kmath.cdist(x, y)), ref, rtol=1e-12)
    with pytest.raises(ValueError):
        kmath.cdist(np.ones((2, 3)), np.ones((2, 4)))
    assert _spec(kmath.cdist, (None, 2), (1, 2)).shape == (None, 1)


def test_special_functions_keep_float_dtypes():
    x = np.array([-0.5, 0.0, 0.25], "float32")
    np.testing.assert_allclose(_np(kmath.erf(x)), scipy.special.erf(x), rtol=1e-6)
    np.testing.assert_allclose(_np(kmath.erfc(x)), scipy.special.erfc(x), rtol=1e-6)
    np.testing.assert_allclose(_np(kmath.erfinv(x)), scipy.special.erfinv(x), rtol=1e-6)
    np.testing.assert_allclose(_np(kmath.rsqrt(np.array([4.0, 16.0]))), [0.5, 0.25])
    for dtype in ("float16", "float32", "float64"):
        assert kmath.erf(np.ones(2, dtype)).dtype == np.dtype(dtype)
    assert kmath.rsqrt(np.ones(2, "int32")).dtype == np.float32


def test_logdet():
    x = _spd((2,), 4)
    np.testing.assert_allclose(_np(kmath.logdet(x)), np.linalg.slogdet(x)[1], rtol=1e-12)


def test_fft_family():
    re, im = RNG.standard_normal((2, 4, 6)), RNG.standard_normal((2, 4, 6))
    z = re + 1j * im
    for fn, ref in ((kmath.fft, np.fft.fft), (kmath.fft2, np.fft.fft2), (kmath.ifft2, np.fft.ifft2)):
        out_re, out_im = fn((re, im))
        np.testing.assert_allclose(_np(out_re) + 1j * _np(out_im), ref(z), atol=1e-10)
        assert out_re.dtype == np.float64
    for n in (None, 4, 9):
        out_re, out_im = kmath.rfft(re, fft_length=n)
        np.testing.assert_allclose(
            _np(out_re) + 1j * _np(out_im), np.fft.rfft(re, n=n), atol=1e-10
        )
        np.testing.assert_allclose(
            _np(kmath.irfft((re, im), fft_length=n)), np.fft.irfft(z, n=n), atol=1e-10
        )
    f32 = kmath.fft((re.astype("float32"), im.astype("float32")))[0]
    assert f32.dtype == np.float32
    with pytest.raises(ValueError, match="tuple of two tensors"):
        kmath.fft(re)
    re_spec, _ = _spec(lambda a, b: kmath.fft((a, b)), (None, 4, 3), (None, 4, 3))
    assert re_spec.shape == (None, 4, 3)
    re_spec, _ = _spec(lambda a: kmath.rfft(a, 8), (None, 5))
    assert re_spec.shape == (None, 5)


def test_extract_sequences():
    x = np.arange(20.0).reshape(2, 10)
    out = _np(kmath.extract_sequences(x, 3, 2))
    assert out.shape == (2, 4, 3)
    np.testing.assert_array_equal(out[1, 2], [14.0, 15.0, 16.0])
    assert _spec(lambda a: kmath.extract_sequences(a, 3, 2), (None, 32)).shape == (None, 15, 3)


def _scipy_stft(x, seq, stride, nfft, window, center):
    if center:
        width = [(0, 0)] * (x.ndim - 1) + [(nfft // 2, nfft // 2)]
        x = np.pad(x, width, mode="reflect")
    l_pad = (nfft - seq) // 2
    win = np.ones(seq) if window is None else (
        scipy.signal.get_window(window, seq) if isinstance(window, str) else window
    )
    win = np.pad(win, (l_pad, nfft - seq - l_pad))
    z = scipy.signal.stft(
        x, fs=1.0, window=win, nperseg=nfft, noverlap=nfft - stride, nfft=nfft,
        boundary=None, padded=False,
    )[-1] * win.sum()
    return np.swapaxes(z, -2, -1)


@pytest.mark.parametrize(
    "seq, stride, nfft, window, center",
    [(16, 4, 16, "hann", True), (8, 4, 11, "hamming", False), (8, 8, 8, None, True)],
)
def test_stft_matches_scipy_and_istft_inverts_it(seq, stride, nfft, window, center):
    x = RNG.standard_normal((2, 64))
    re, im = kmath.stft(x, seq, stride, nfft, window, center)
    ref = _scipy_stft(x, seq, stride, nfft, window, center)
    np.testing.assert_allclose(_np(re) + 1j * _np(im), ref, atol=1e-10)
    if window is not None and center:
        back = _np(kmath.istft((re, im), seq, stride, nfft, length=64, window=window, center=True))
        # Away from the edges, overlap-add with the normalised window
        # reconstructs the signal.
        np.testing.assert_allclose(back[:, nfft:-nfft], x[:, nfft:-nfft], atol=1e-10)


def test_stft_and_istft_trace_and_validate():
    re, im = _spec(lambda a: kmath.stft(a, 10, 3, 15), (None, 32))
    assert re.shape == (None, 11, 8)
    out = _spec(lambda a, b: kmath.istft((a, b), 10, 3, 16), (None, 11, 9), (None, 11, 9))
    assert out.shape == (None, 3 * 10 + 16 - 16)
    with pytest.raises(TypeError, match="float32"):
        kmath.stft(np.ones(8, "int32"), 4, 1, 4)
    with pytest.raises(ValueError, match="positive integer"):
        kmath.stft(np.ones(8), 4, 0, 4)
    with pytest.raises(ValueError, match="window"):
        kmath.stft(np.ones(8), 4, 1, 4, window="triangle")


def test_half_precision_inputs_compute_and_keep_their_dtype():
    x = _spd((), 3)
    for dtype in ("float16", "bfloat16"):
        xd = keras.ops.convert_to_tensor(x, dtype)
        out = linalg.inv(xd)
        assert keras.backend.standardize_dtype(out.dtype) == dtype
        np.testing.assert_allclose(
            np.asarray(out).astype("float32"), np.linalg.inv(x), rtol=5e-2, atol=5e-2
        )
        re, _ = kmath.rfft(xd)
        assert keras.backend.standardize_dtype(re.dtype) == dtype
