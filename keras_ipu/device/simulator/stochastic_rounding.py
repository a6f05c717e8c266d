"""Stochastic rounding to float16, as the IPU's rounding unit does it.

A value x between adjacent float16 numbers lo < x < hi becomes hi with
probability (x - lo) / (hi - lo) and lo otherwise, so E[round(x)] = x: small
updates (a learning rate times a gradient) survive on average instead of
being rounded away.

The kernel works on the bits of float32, vectorised:
- normal float16 range (|x| >= 2**-14): float16 keeps the top 10 of the 23
  float32 mantissa bits. Adding a uniform random integer in [0, 2**13) to the
  bits and clearing the low 13 carries into the kept bits exactly when the
  dropped fraction plus the random number reaches 2**13, that is with
  probability fraction / 2**13. A carry out of the mantissa bumps the
  exponent, which is the next float16 up, so no special case. The bits are
  sign and magnitude, so a negative value's magnitude rounds the same way:
  unbiased too. 16 random bits per element (13 used) come from the
  generator's raw output, four elements per 64-bit draw.
- subnormal float16 range (|x| < 2**-14): the spacing is a constant 2**-24,
  so the value is scaled by 2**24 (exact, a power of two), split into its
  integer and fractional parts (exact in float32) and rounded up when the
  fraction plus a 24-bit uniform number reaches 1.
- inf and NaN pass through unchanged. Finite values that round past the
  largest float16 (65504) become +-inf here; what overflow then means on the
  IPU (clip or NaN, and whether it traps) is decided by the caller
  (keras_ipu/device/simulator/numerics.py).

float64 input is rounded to float32 first (to nearest), which leaves a bias
of at most 2**-29 relative: the device has no float64 anyway.
"""

import numpy as np

_DROPPED_BITS = 13  # float32 mantissa 23 bits, float16 10 bits
_DROPPED_MASK = np.uint32((1 << _DROPPED_BITS) - 1)
_REBIAS = (127 - 15) << 10  # exponent bias difference, at the float16 exponent
_F16_INF_BITS = 0x7C00
_F16_SMALLEST_NORMAL = np.float32(2.0**-14)
_SUBNORMAL_SCALE = np.float32(2.0**24)
_SUBNORMAL_STEP = np.float32(2.0**-24)
_UNIFORM_24 = 2.0**-24


def _raw_bits(rng, n, dtype):
    """n uniform unsigned integers of `dtype`, cut from the generator's raw
    64-bit output (no range reduction: every bit is used)."""
    per_word = 8 // np.dtype(dtype).itemsize
    raw = rng.bit_generator.random_raw((n + per_word - 1) // per_word)
    return np.asarray(raw, np.uint64).view(dtype)[:n]


def round_to_float16(x, rng=None, words=None):
    """Stochastically round `x` (any real array) to a float16 array.

    `words` (uint32, x's shape) are the random bits to use: the low 13 round
    a normal value, the top 24 a subnormal one. By default they are drawn
    from `rng` (a numpy Generator), 16 bits per element and 24 more per
    subnormal one.
    """
    x = np.asarray(x)
    if x.dtype != np.float32:
        with np.errstate(over="ignore", invalid="ignore"):
            x = x.astype(np.float32)
    shape = x.shape
    # 1-d: NumPy gives scalars, not arrays, for arithmetic on 0-d arrays.
    x = x.reshape(-1)
    if words is None:
        noise = _raw_bits(rng, x.size, np.uint16)
    else:
        words = np.asarray(words, np.uint32).reshape(-1)
        noise = words
    # Sign and magnitude together: the magnitude of a finite float32 is
    # below 0x7F800000, so the addition never reaches the sign bit. Then the
    # float16 bits straight from the rounded float32 bits: drop the 13 bits
    # (the truncation), move the sign down, rebias the exponent (127 -> 15)
    # and saturate what is past 65504 at the bits of inf (inf stays inf).
    t = np.bitwise_and(noise, _DROPPED_MASK, dtype=np.uint32)
    t += x.view(np.uint32)
    t >>= np.uint32(_DROPPED_BITS)
    sign = (t >> np.uint32(3)) & np.uint32(0x8000)
    t &= np.uint32(0x3FFFF)
    t -= np.uint32(_REBIAS)
    np.minimum(t, np.uint32(_F16_INF_BITS), out=t)
    t |= sign
    out = t.astype(np.uint16).view(np.float16)
    # NaN (whatever its payload) and the float16 subnormal range, where the
    # rebiasing above is wrong, take the slow path. NaN fails every
    # comparison.
    regular = np.abs(x) >= _F16_SMALLEST_NORMAL
    if not regular.all():
        index = np.flatnonzero(~regular)
        xs = x[index]
        nan = np.isnan(xs)
        ax = np.abs(xs) * _SUBNORMAL_SCALE
        whole = np.floor(ax)
        if words is None:
            top = _raw_bits(rng, xs.size, np.uint32)
        else:
            top = words[index]
        # Up when fraction + uniform reaches 1: the carry of the normal
        # case, so the same random word rounds the same way in both ranges.
        # float64 holds the sum exactly.
        u = (top >> np.uint32(8)).astype(np.float64) * _UNIFORM_24
        with np.errstate(invalid="ignore"):
            up = (u + (ax - whole).astype(np.float64)) >= 1.0
            small = np.copysign((whole + up) * _SUBNORMAL_STEP, xs)
        # Exact: multiples of 2**-24 below 2**-14 (or NaN).
        out[index] = np.where(nan, xs, small).astype(np.float16)
    return out.reshape(shape)
