"""The fast Fourier transform primitive (as jax.lax.fft, with NumPy's
length semantics).

fft(x, fft_type, fft_lengths) transforms the last len(fft_lengths) axes:
  FFT / IFFT   complex -> complex, each axis to its length;
  RFFT         real -> complex, the last axis to length n // 2 + 1;
  IRFFT        complex (n // 2 + 1 bins) -> real of length n.
As NumPy's `s=` argument: each axis is cropped or zero-padded to its
length first (for IRFFT the last axis to n // 2 + 1); a length of None keeps
the input's length (for IRFFT: n = 2 * (bins - 1)). The normalisation is
NumPy's "backward" one (1/n on the inverse transforms).

Gradient rules: grads/fft.py (registered once every primitive exists).
"""

import numpy as np

from keras_ipu.device.ir import ShapedArray
from keras_ipu.device.primitives import cost_util as _cost
from keras_ipu.device.primitives import shape_rules
from keras_ipu.device.primitives.registry import Primitive

FFT_TYPES = ("FFT", "IFFT", "RFFT", "IRFFT")


def _complex_of(dtype):
    if dtype.kind == "c":
        return dtype
    return np.dtype(np.complex128 if dtype == np.float64 else np.complex64)


def _real_of(dtype):
    if dtype.kind == "c":
        return np.dtype(np.float64 if dtype == np.complex128 else np.float32)
    return dtype


def _check(x, fft_type, fft_lengths):
    if fft_type not in FFT_TYPES:
        raise ValueError(f"fft: fft_type must be one of {FFT_TYPES}; got {fft_type!r}.")
    fft_lengths = tuple(fft_lengths)
    if not 1 <= len(fft_lengths) <= 3:
        raise ValueError(
            f"fft: 1 to 3 transformed axes are supported; got fft_lengths={fft_lengths}."
        )
    for n in fft_lengths:
        if n is not None and (not isinstance(n, (int, np.integer)) or n < 1):
            raise ValueError(
                f"fft: every fft length must be a positive int or None; got {fft_lengths}."
            )
    if x.ndim < len(fft_lengths):
        raise shape_rules.ShapeError(
            f"fft: a {len(fft_lengths)}-D transform needs an operand of rank >= "
            f"{len(fft_lengths)}; got shape {x.shape}."
        )
    if fft_type == "RFFT":
        if not (x.dtype.kind == "f" or x.dtype.name == "bfloat16"):
            raise TypeError(f"fft: RFFT takes a real float operand; got {x.dtype}.")
    elif x.dtype.kind != "c":
        raise TypeError(f"fft: {fft_type} takes a complex operand; got {x.dtype}.")
    return fft_lengths


def transform_lengths(shape, fft_type, fft_lengths):
    """The transform lengths with None resolved from the input shape."""
    dims = shape[len(shape) - len(fft_lengths):]
    out = []
    for i, (n, d) in enumerate(zip(fft_lengths, dims)):
        if n is None and d is not None and fft_type == "IRFFT" and i == len(dims) - 1:
            n = 2 * (d - 1)
        out.append(d if n is None else n)
    return tuple(out)


def _fft_rule(x, *, fft_type, fft_lengths):
    fft_lengths = _check(x, fft_type, fft_lengths)
    k = len(fft_lengths)
    lengths = list(transform_lengths(x.shape, fft_type, fft_lengths))
    if fft_type == "RFFT" and lengths[-1] is not None:
        lengths[-1] = lengths[-1] // 2 + 1
    if fft_type == "IRFFT":
        dtype = _real_of(x.dtype)
    else:
        dtype = _complex_of(x.dtype)
    return ShapedArray(tuple(x.shape[:-k]) + tuple(lengths), dtype)


_NUMPY_FFT = {"FFT": "fftn", "IFFT": "ifftn", "RFFT": "rfftn", "IRFFT": "irfftn"}


def _fft(x, *, fft_type, fft_lengths):
    k = len(fft_lengths)
    s = transform_lengths(x.shape, fft_type, fft_lengths)
    axes = tuple(range(x.ndim - k, x.ndim))
    if fft_type == "RFFT" and x.dtype.itemsize < 4:
        x = x.astype(np.float32)  # pocketfft has no float16/bfloat16
    out = getattr(np.fft, _NUMPY_FFT[fft_type])(x, s=s, axes=axes)
    want = _fft_rule(
        ShapedArray(x.shape, x.dtype), fft_type=fft_type, fft_lengths=fft_lengths
    ).dtype
    return out.astype(want, copy=False)


fft_p = Primitive("fft", _fft_rule, _fft, fp_class="checked")


# -- cost rules (formulas and constants: keras_ipu/device/simulator/cost_model.py)


def _fft_flops(ins, outs, *, fft_type, fft_lengths):
    # Cooley-Tukey: 5 N log2 N real FLOPs per complex transform of N points.
    n = 1
    for length in fft_lengths:
        n *= length
    transforms = max(_cost.size(outs[0]), _cost.size(ins[0])) // max(n, 1)
    return 5 * n * _cost.log2(n) * max(transforms, 1)


fft_p.cost = _cost.per_output("fft", _fft_flops)
