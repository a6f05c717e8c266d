"""Gradient rules of the primitives of primitives/fft.py (contract:
keras_ipu/device/autodiff/__init__.py), registered when the primitive set
is imported (primitives/__init__.py), after every primitive is declared."""

import numpy as np

from keras_ipu.device.primitives import ad_util
from keras_ipu.device.primitives import elementwise as ew
from keras_ipu.device.primitives.fft import transform_lengths
from keras_ipu.device.primitives.fft import fft_p
from keras_ipu.device.primitives.structure import pad_p


def _fit(ct, shape, k):
    """ct cropped or zero-padded on its last k axes to `shape`'s: the
    transpose of the zero-pad/crop the forward applies to its input."""
    config = ((0, 0, 0),) * (len(shape) - k)
    for d, n in zip(shape[len(shape) - k:], ct.shape[-k:]):
        if d is None or n is None:
            if d == n:
                config += ((0, 0, 0),)
                continue
            raise NotImplementedError(
                "The gradient of fft needs the transformed sizes; got "
                f"shape {tuple(shape)}.")
        config += ((0, d - n, 0),)
    if any(c != (0, 0, 0) for c in config):
        ct = pad_p.bind(ct, ad_util.scalar(0, ct.dtype), config=config)
    return ct


def _fft_grad(cts, inputs, outputs, *, fft_type, fft_lengths):
    """The DFT matrix is symmetric, so the transpose of an (I)FFT is the
    same (I)FFT of the cotangent, followed by the transpose of the
    crop/zero-pad that fitted the input to the lengths. For the real
    transforms (cotangents of complex values c satisfy dL = Re(sum c dz)):
    RFFT's is Re(FFT(g zero-extended to the full spectrum)); IRFFT's is
    conj(RFFT(g)) weighted by 2/n (1/n for the DC and Nyquist bins, which
    appear once in the real signal)."""
    (g,), (x,) = cts, inputs
    k = len(fft_lengths)
    s = transform_lengths(x.shape, fft_type, fft_lengths)
    if any(n is None for n in s):
        raise NotImplementedError(
            f"The gradient of fft needs the transform lengths; got {s}.")
    if fft_type in ("FFT", "IFFT"):
        ct = fft_p.bind(g, fft_type=fft_type, fft_lengths=tuple(s))
        return [_fit(ct, x.shape, k)]
    if fft_type == "RFFT":
        n = s[-1]
        bins = n // 2 + 1
        config = ((0, 0, 0),) * (g.ndim - 1) + ((0, n - bins, 0),)
        full = pad_p.bind(g, ad_util.scalar(0, g.dtype), config=config)
        ct = ew.real_p.bind(fft_p.bind(full, fft_type="FFT",
                                       fft_lengths=tuple(s)))
        return [_fit(ad_util.convert(ct, x.dtype), x.shape, k)]
    # IRFFT
    n = s[-1]
    bins = n // 2 + 1
    spec = fft_p.bind(g, fft_type="RFFT", fft_lengths=tuple(s))
    weight = np.full(bins, 2.0)
    weight[0] = 1.0
    if n % 2 == 0:
        weight[-1] = 1.0
    weight /= float(np.prod(s))
    ct = ew.mul_p.bind(ew.conj_p.bind(spec), weight.astype(spec.dtype))
    return [_fit(ad_util.convert(ct, x.dtype), x.shape, k)]


fft_p.grad = _fft_grad
