"""Keras backend `math` ops for the ipu backend (built from device primitives).

Segment reductions are scatters, top_k is the top_k primitive, the Fourier
ops are the fft primitive (Keras passes complex values as (real, imag)
pairs, as the IPU has no complex type), stft frames the signal with a
gather, istft overlap-adds its frames with pads, reshapes and a sum.
"""

import numpy as np

from keras.src.backend.common import standardize_dtype

from keras_ipu.backend import linalg as _linalg
from keras_ipu.backend import prims
from keras_ipu.backend.core import convert_to_tensor
from keras_ipu.backend.linalg import common_inexact_dtype
from keras_ipu.device.array import Tensor
from keras_ipu.device.primitives import elementwise as ew
from keras_ipu.device.primitives import reduce as red
from keras_ipu.device.primitives import special as sp
from keras_ipu.device.primitives.fft import fft_p
from keras_ipu.device.primitives.indexing import gather_p
from keras_ipu.device.primitives.indexing import scatter_p
from keras_ipu.device.primitives.indexing import slice_p
from keras_ipu.device.primitives.sort import top_k_p
from keras_ipu.device.primitives.structure import broadcast_to_p
from keras_ipu.device.primitives.structure import concatenate_p
from keras_ipu.device.primitives.structure import pad_p
from keras_ipu.device.primitives.structure import rev_p

# ------------------------------------------------------------------ helpers


def _float(x):
    """x as a tensor of a float dtype (integers/bool: Keras' float result)."""
    return _linalg.as_inexact(x)


def _move_front_to_back(x, count):
    """Moves the first `count` axes behind the others."""
    return prims.transpose(x, tuple(range(count, x.ndim)) + tuple(range(count)))


def _known_length(x, what):
    n = x.shape[-1]
    if n is None:
        raise ValueError(
            f"{what} needs the length of the last axis to be known; got shape "
            f"{tuple(x.shape)}. Give the signal a static length."
        )
    return n


# ------------------------------------------------------- segment reductions


def _segment_reduce(data, segment_ids, num_segments, mode, identity):
    # (`sorted` is only a hint elsewhere: a scatter does not need sorted ids.)
    data = convert_to_tensor(data)
    segment_ids = convert_to_tensor(segment_ids)
    if segment_ids.dtype.kind not in "iu":
        segment_ids = prims.cast(segment_ids, np.int32)
    if num_segments is None:
        if not isinstance(segment_ids, Tensor):
            raise ValueError(
                "`num_segments` must be set when the segment reduction is "
                "traced or compiled: the output size cannot depend on the "
                "values of `segment_ids` in an IPU program."
            )
        # Eagerly the number of segments is read off the ids, as NumPy does.
        num_segments = (
            int(red.reduce_max_p.bind(segment_ids, axes=(0,))) + 1
            if segment_ids.shape[0]
            else 0
        )
    num_segments = int(num_segments)
    # Negative ids drop their rows: send them past the end, where the
    # scatter drops out-of-range rows (it would wrap -1 to the last row).
    ids = ew.select_p.bind(
        ew.lt_p.bind(segment_ids, prims.scalar(0, segment_ids.dtype)),
        prims.scalar(num_segments, segment_ids.dtype),
        segment_ids,
    )
    ids = prims.expand_dims(ids, -1)
    out_shape = (num_segments,) + tuple(data.shape[1:])
    fill = prims.scalar(identity(data.dtype), data.dtype)
    if None in out_shape:
        # Traced with unknown trailing dims: a constant cannot have them,
        # so the filled buffer is derived from (a reduction of) data.
        like = red.reduce_sum_p.bind(data, axes=(0,))
        fill = ew.select_p.bind(np.False_, like, fill)
    init = broadcast_to_p.bind(fill, shape=out_shape)
    return scatter_p.bind(init, ids, data, mode=mode)


def _lowest(dtype):
    if dtype.kind == "f" or dtype.name == "bfloat16":
        return -np.inf
    if dtype.kind == "b":
        return False
    return np.iinfo(dtype).min


def _highest(dtype):
    if dtype.kind == "f" or dtype.name == "bfloat16":
        return np.inf
    if dtype.kind == "b":
        return True
    return np.iinfo(dtype).max


def segment_sum(data, segment_ids, num_segments=None, sorted=False):
    return _segment_reduce(data, segment_ids, num_segments, "add", lambda d: 0)


def segment_max(data, segment_ids, num_segments=None, sorted=False):
    # Empty segments hold the identity of max: -inf (the lowest integer).
    return _segment_reduce(data, segment_ids, num_segments, "max", _lowest)


def segment_min(data, segment_ids, num_segments=None, sorted=False):
    return _segment_reduce(data, segment_ids, num_segments, "min", _highest)


def segment_prod(data, segment_ids, num_segments=None, sorted=False):
    return _segment_reduce(data, segment_ids, num_segments, "mul", lambda d: 1)


# ------------------------------------------------------------- top k, rank


def top_k(x, k, sorted=True):
    # Unsorted output may come in any order, so sorted output serves both.
    x = convert_to_tensor(x)
    return tuple(top_k_p.bind(x, k=int(k), index_dtype=np.dtype(np.int32)))


def in_top_k(targets, predictions, k):
    predictions = convert_to_tensor(predictions)
    targets = prims.cast(convert_to_tensor(targets), np.int32)
    n = _known_length(predictions, "in_top_k")
    is_target = ew.eq_p.bind(
        prims.expand_dims(targets, -1), np.arange(n, dtype=np.int32)
    )
    zero = prims.scalar(0, predictions.dtype)
    target_score = red.reduce_sum_p.bind(
        ew.select_p.bind(is_target, predictions, zero), axes=(predictions.ndim - 1,)
    )
    # NaN is no score at all: it is never in the top k.
    lowest = prims.scalar(_lowest(predictions.dtype), predictions.dtype)
    target_score = ew.select_p.bind(ew.isnan_p.bind(target_score), lowest, target_score)
    target_score = prims.expand_dims(target_score, -1)
    # Ties count in the target's favour: rank = 1 + #strictly greater.
    greater = prims.cast(ew.gt_p.bind(predictions, target_score), np.int32)
    above = red.reduce_sum_p.bind(greater, axes=(predictions.ndim - 1,))
    return ew.lt_p.bind(above, prims.scalar(int(k), np.int32))


def logsumexp(x, axis=None, keepdims=False):
    x = _float(x)
    if axis is None:
        axes = tuple(range(x.ndim))
    else:
        axes = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
        axes = tuple(sorted(int(a) % x.ndim for a in axes)) if x.ndim else ()
    kept = tuple(1 if i in axes else d for i, d in enumerate(x.shape))
    peak = red.reduce_max_p.bind(x, axes=axes)
    # Shift by the max for stability; an infinite max is not shifted by
    # (inf - inf would be NaN).
    finite = ew.isfinite_p.bind(peak)
    shift = ew.select_p.bind(finite, peak, prims.scalar(0, x.dtype))
    total = red.reduce_sum_p.bind(
        ew.exp_p.bind(ew.sub_p.bind(x, prims.reshape(shift, kept))), axes=axes
    )
    out = ew.add_p.bind(ew.log_p.bind(total), shift)
    return prims.reshape(out, kept) if keepdims else out


def cdist(x, y):
    x, y = convert_to_tensor(x), convert_to_tensor(y)
    if x.ndim < 2 or y.ndim < 2:
        raise ValueError(
            "`cdist` inputs must have rank >= 2 (points along the last two "
            f"axes); got shapes {tuple(x.shape)} and {tuple(y.shape)}."
        )
    if None not in (x.shape[-1], y.shape[-1]) and x.shape[-1] != y.shape[-1]:
        raise ValueError(
            "Last dimension of inputs to `cdist` must match (the points' "
            f"dimension); got shapes {tuple(x.shape)} and {tuple(y.shape)}."
        )
    dtype = common_inexact_dtype(x, y)
    x, y = convert_to_tensor(x, dtype), convert_to_tensor(y, dtype)
    xs = prims.reshape(x, tuple(x.shape[:-1]) + (1, x.shape[-1]))
    ys = prims.reshape(y, tuple(y.shape[:-2]) + (1,) + tuple(y.shape[-2:]))
    diff = ew.sub_p.bind(xs, ys)
    squared = red.reduce_sum_p.bind(ew.mul_p.bind(diff, diff), axes=(diff.ndim - 1,))
    return ew.sqrt_p.bind(squared)


# ------------------------------------------------------ elementwise special


def rsqrt(x):
    return ew.rsqrt_p.bind(_float(x))


def erf(x):
    return sp.erf_p.bind(_float(x))


def erfc(x):
    return sp.erfc_p.bind(_float(x))


def erfinv(x):
    return sp.erfinv_p.bind(_float(x))


def logdet(x):
    return _linalg.slogdet(x)[1]


# ------------------------------------------------------------- Fourier ops


def _complex_from_pair(x):
    if not isinstance(x, (tuple, list)) or len(x) != 2:
        raise ValueError(
            "Input `x` should be a tuple of two tensors - real and imaginary. "
            f"Received: x={x}"
        )
    real, imag = convert_to_tensor(x[0]), convert_to_tensor(x[1])
    if tuple(real.shape) != tuple(imag.shape):
        raise ValueError(
            "Input `x` should be a tuple of two tensors - real and imaginary. "
            "Both the real and imaginary parts should have the same shape. "
            f"Received: x[0].shape = {real.shape}, x[1].shape = {imag.shape}"
        )
    if not all(
        d.kind == "f" or d.name == "bfloat16" for d in (real.dtype, imag.dtype)
    ):
        raise ValueError(
            "At least one tensor in input `x` is not of type float. "
            f"Received: x={x}."
        )
    dtype = common_inexact_dtype(real, imag)
    cdtype = np.dtype(np.complex128 if dtype == "float64" else np.complex64)
    z = ew.add_p.bind(
        prims.cast(real, cdtype),
        ew.mul_p.bind(prims.cast(imag, cdtype), prims.scalar(1j, cdtype)),
    )
    return z, dtype


def _get_complex_tensor_from_tuple(x):
    """The complex tensor of a (real, imag) pair (keras.ops.polar asks the
    backend for it by this name)."""
    return _complex_from_pair(x)[0]


def _to_pair(z, dtype):
    return prims.cast(ew.real_p.bind(z), dtype), prims.cast(ew.imag_p.bind(z), dtype)


def _check_rank(x, rank):
    if x.ndim < rank:
        raise ValueError(
            f"Input should have rank >= {rank}. Received: input.shape = {x.shape}"
        )


def fft(x):
    z, dtype = _complex_from_pair(x)
    _check_rank(z, 1)
    return _to_pair(fft_p.bind(z, fft_type="FFT", fft_lengths=(z.shape[-1],)), dtype)


def fft2(x):
    z, dtype = _complex_from_pair(x)
    _check_rank(z, 2)
    lengths = tuple(z.shape[-2:])
    return _to_pair(fft_p.bind(z, fft_type="FFT", fft_lengths=lengths), dtype)


def ifft2(x):
    z, dtype = _complex_from_pair(x)
    _check_rank(z, 2)
    lengths = tuple(z.shape[-2:])
    return _to_pair(fft_p.bind(z, fft_type="IFFT", fft_lengths=lengths), dtype)


def rfft(x, fft_length=None):
    x = _float(x)
    _check_rank(x, 1)
    n = None if fft_length is None else int(fft_length)
    return _to_pair(fft_p.bind(x, fft_type="RFFT", fft_lengths=(n,)), x.dtype)


def irfft(x, fft_length=None):
    z, dtype = _complex_from_pair(x)
    _check_rank(z, 1)
    n = None if fft_length is None else int(fft_length)
    out = fft_p.bind(z, fft_type="IRFFT", fft_lengths=(n,))
    return prims.cast(out, np.dtype(dtype))


# ------------------------------------------------------- framing, stft


def _frame_indices(length, sequence_length, sequence_stride):
    """(num_sequences, sequence_length, 1): where each frame's samples are."""
    count = 1 + (length - sequence_length) // sequence_stride
    starts = np.arange(max(count, 0)) * sequence_stride
    idx = starts[:, None] + np.arange(sequence_length)[None, :]
    return idx[..., None].astype(np.int32)


def extract_sequences(x, sequence_length, sequence_stride):
    x = convert_to_tensor(x)
    _check_rank(x, 1)
    length = _known_length(x, "extract_sequences")
    idx = _frame_indices(length, int(sequence_length), int(sequence_stride))
    # The gather reads leading axes: put the signal axis first, gather
    # (num_sequences, sequence_length) samples, move them back behind.
    frames = gather_p.bind(prims.moveaxis(x, -1, 0), idx, mode="clip")
    return _move_front_to_back(frames, 2)


def _check_stride(sequence_stride):
    if (
        isinstance(sequence_stride, bool)
        or not isinstance(sequence_stride, (int, np.integer))
        or sequence_stride < 1
    ):
        raise ValueError(
            "`sequence_stride` must be a positive integer. "
            f"Received: sequence_stride={sequence_stride}"
        )


def _window(window, sequence_length, fft_length, dtype):
    """The window zero-padded (centred) to fft_length, or None for none."""
    l_pad = (fft_length - sequence_length) // 2
    r_pad = fft_length - sequence_length - l_pad
    if window is None:
        return None
    if isinstance(window, str):
        if window not in ("hann", "hamming"):
            raise ValueError(
                "If a string is passed to `window`, it must be one of "
                f'`"hann"`, `"hamming"`. Received: window={window}'
            )
        # A window of static length is a constant of the program.
        from scipy import signal

        win = signal.get_window(window, sequence_length).astype(dtype)
        return np.pad(win, (l_pad, r_pad))
    win = convert_to_tensor(window, standardize_dtype(dtype))
    if win.ndim != 1 or win.shape[-1] != sequence_length:
        raise ValueError(
            "The shape of `window` must be equal to [sequence_length]. "
            f"Received: window shape={tuple(win.shape)}"
        )
    if l_pad or r_pad:
        win = pad_p.bind(win, prims.scalar(0, dtype), config=((l_pad, r_pad, 0),))
    return win


def _slice_last(x, start, stop):
    n = x.ndim
    return slice_p.bind(
        x,
        start_indices=(0,) * (n - 1) + (start,),
        limit_indices=(None,) * (n - 1) + (stop,),
        strides=(1,) * n,
    )


def _reflect_pad_last(x, pad):
    """NumPy's mode="reflect" on the last axis (edge not repeated)."""
    if pad == 0:
        return x
    n = _known_length(x, "stft with center=True")
    if pad >= n:
        raise ValueError(
            f"stft with center=True reflects {pad} samples at each end, which "
            f"needs a signal longer than that; got length {n}. Use a shorter "
            "fft_length or center=False."
        )
    last = (x.ndim - 1,)
    left = rev_p.bind(_slice_last(x, 1, pad + 1), axes=last)
    right = rev_p.bind(_slice_last(x, n - pad - 1, n - 1), axes=last)
    return concatenate_p.bind(left, x, right, axis=x.ndim - 1)


def stft(
    x, sequence_length, sequence_stride, fft_length, window="hann", center=True
):
    x = convert_to_tensor(x)
    if standardize_dtype(x.dtype) not in ("float32", "float64"):
        raise TypeError(
            "Invalid input type. Expected `float32` or `float64`. "
            f"Received: input type={x.dtype}"
        )
    if fft_length < sequence_length:
        raise ValueError(
            "`fft_length` must equal or larger than `sequence_length`. "
            f"Received: sequence_length={sequence_length}, "
            f"fft_length={fft_length}"
        )
    _check_stride(sequence_stride)
    win = _window(window, sequence_length, fft_length, x.dtype)
    if center:
        x = _reflect_pad_last(x, fft_length // 2)
    frames = extract_sequences(x, fft_length, sequence_stride)
    if win is not None:
        frames = ew.mul_p.bind(frames, win)
    spectrum = fft_p.bind(frames, fft_type="RFFT", fft_lengths=(fft_length,))
    return _to_pair(spectrum, x.dtype)


def _overlap_add(frames, sequence_stride):
    """Sums frames (..., num_sequences, frame_length) placed sequence_stride
    apart into one signal (..., stride * (num_sequences - 1) + frame_length).

    Only pads, reshapes and one sum (TF's overlap_and_add skew): block j of
    frame i (samples j*s .. j*s+s-1) belongs at block i + j. Laid out as
    (blocks j, frames i, s) with `blocks` zero frames appended to each row,
    flattened and re-read with rows one frame shorter, row j moves j blocks
    to the right; the sum over rows adds every block at its place.
    """
    count, frame_length = frames.shape[-2:]
    if count is None or frame_length is None:
        raise ValueError(
            "istft needs the number of frames and the fft length to be known; "
            f"got frames of shape {tuple(frames.shape)}."
        )
    s = sequence_stride
    batch = tuple(frames.shape[:-2])
    nb = len(batch)
    blocks = -(-frame_length // s)
    zero = prims.scalar(0, frames.dtype)
    no_pad = ((0, 0, 0),) * nb
    x = pad_p.bind(
        frames, zero, config=no_pad + ((0, 0, 0), (0, blocks * s - frame_length, 0))
    )
    x = prims.reshape(x, batch + (count, blocks, s))
    perm = tuple(range(nb)) + (nb + 1, nb, nb + 2)
    x = prims.transpose(x, perm)  # (..., blocks, count, s)
    width = count + blocks
    x = pad_p.bind(x, zero, config=no_pad + ((0, 0, 0), (0, blocks, 0), (0, 0, 0)))
    x = prims.reshape(x, batch + (blocks * width * s,))
    x = _slice_last(x, 0, blocks * (width - 1) * s)
    x = prims.reshape(x, batch + (blocks, (width - 1) * s))
    x = red.reduce_sum_p.bind(x, axes=(nb,))
    return _slice_last(x, 0, s * (count - 1) + frame_length)


def _window_sum_square(win, sequence_stride, fft_length):
    """Per-sample sum of the squared window over every frame that overlaps
    it, for a steady-state frame: the istft normaliser."""
    overlaps = -(-fft_length // sequence_stride)
    padded_length = overlaps * sequence_stride
    sq = ew.mul_p.bind(win, win)
    sq = pad_p.bind(
        sq, prims.scalar(0, sq.dtype), config=((0, padded_length - fft_length, 0),)
    )
    per_phase = red.reduce_sum_p.bind(
        prims.reshape(sq, (overlaps, sequence_stride)), axes=(0,)
    )
    tiled = broadcast_to_p.bind(per_phase, shape=(overlaps, sequence_stride))
    return _slice_last(prims.reshape(tiled, (padded_length,)), 0, fft_length)


def istft(
    x,
    sequence_length,
    sequence_stride,
    fft_length,
    length=None,
    window="hann",
    center=True,
):
    z, dtype = _complex_from_pair(x)
    dtype = np.dtype(dtype)
    if z.ndim < 2:
        raise ValueError(
            "Input `x` must have at least 2 dimensions. "
            f"Received shape: {tuple(z.shape)}"
        )
    _check_stride(sequence_stride)
    frames = prims.cast(
        fft_p.bind(z, fft_type="IRFFT", fft_lengths=(fft_length,)), dtype
    )
    win = _window(window, sequence_length, fft_length, dtype)
    if win is not None:
        win = convert_to_tensor(win)
        norm = _window_sum_square(win, sequence_stride, fft_length)
        frames = ew.mul_p.bind(frames, ew.div_p.bind(win, norm))
    signal = _overlap_add(frames, sequence_stride)
    start = fft_length // 2 if center else 0
    if length is not None:
        stop = start + int(length)
    elif center:
        stop = -(fft_length // 2)
    else:
        stop = signal.shape[-1]
    return _slice_last(signal, start, stop)
