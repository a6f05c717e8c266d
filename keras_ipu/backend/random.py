"""Keras backend `random` ops for the ipu backend.

Every sampler turns the bits of the stateless `random_bits` primitive
(Philox-4x32-10, keyed by the uint32[2] seed state) into its distribution
with elementwise primitives, so sampling traces and compiles like any other
op and a compiled step stays a pure function of its seed input:
  - uniform: random mantissa bits under the exponent of 1.0, minus 1;
  - normal / truncated normal: inverse CDF (erfinv) of a uniform;
  - categorical: Gumbel-max (argmax of logits + Gumbel noise);
  - gamma: Marsaglia-Tsang with a fixed number of rejection rounds, all
    drawn at once and the first accepted one selected;
  - binomial: CDF inversion for small means, BTRS (Hormann) with fixed
    rejection rounds for large ones;
  - beta: X / (X + Y) with X, Y gamma.
Draws that one sampler needs independently come from disjoint `stream`s of
the same key.
"""

import math

import ml_dtypes
import numpy as np

from keras.src.backend.common import standardize_dtype
from keras.src.random.seed_generator import SeedGenerator  # noqa: F401
from keras.src.random.seed_generator import draw_seed
from keras.src.random.seed_generator import make_default_seed  # noqa: F401

from keras_ipu.backend.core import convert_to_tensor
from keras_ipu.backend.prims import add as _add
from keras_ipu.backend.prims import cast as _cast
from keras_ipu.backend.prims import div as _div
from keras_ipu.backend.prims import is_array as _is_array
from keras_ipu.backend.prims import mul as _mul
from keras_ipu.backend.prims import np_dtype
from keras_ipu.backend.prims import select as _select
from keras_ipu.backend.prims import sub as _sub
from keras_ipu.backend.dtype_utils import floatx
from keras_ipu.device.primitives import elementwise as ew
from keras_ipu.device.primitives import special
from keras_ipu.device.primitives.convert import bitcast_convert_type_p
from keras_ipu.device.primitives.random_bits import random_bits
from keras_ipu.device.primitives.reduce import argmax_p
from keras_ipu.device.primitives.sort import sort_p
from keras_ipu.device.primitives.structure import reshape_p

# Fixed rejection rounds: the chance that all rounds reject is below 1e-10
# for Marsaglia-Tsang (acceptance >= 0.95) and 1e-9 for BTRS (>= 0.8).
_GAMMA_ROUNDS = 8
_BTRS_ROUNDS = 12
# Binomials with mean below this use CDF inversion over this many terms;
# P(X >= 40) for a mean below 10 is under 1e-11.
_SMALL_MEAN = 10.0
_INVERSION_TERMS = 40


# ---------------------------------------------------------------- helpers
def _shape(shape):
    """A static shape tuple (ints, or None for dims unknown while traced)."""
    if isinstance(shape, int):
        shape = (shape,)
    out = []
    for d in shape:
        if d is None:
            out.append(None)
        elif _is_array(d):
            raise ValueError(
                f"Random ops need a static shape; got a tensor in {shape!r}. "
                "Use Python ints (keras.ops.shape(x) gives them eagerly)."
            )
        else:
            out.append(int(d))
    return tuple(out)


def _key(seed):
    """The uint32[2] key of a seed (int, SeedGenerator, None or key tensor)."""
    if _is_array(seed) or isinstance(seed, np.ndarray):
        key = seed
    else:
        key = draw_seed(seed)
    key = convert_to_tensor(key)
    key = _cast(key, np.uint32)
    if len(key.shape) != 1 or key.shape[0] not in (2, None):
        raise ValueError(
            "A seed tensor must be a key of shape (2,) (a Keras seed state); "
            f"got shape {tuple(key.shape)}. Pass an int seed or a "
            "keras.random.SeedGenerator instead."
        )
    return key


def _compute_dtype(dtype):
    """Samplers compute in float32 (float64 for float64 results): float16 and
    bfloat16 have too few bits for inverse CDFs and rejection tests."""
    return np.dtype(np.float64 if dtype == np.float64 else np.float32)


def _unit_uniform(key, shape, dtype, stream=0):
    """Uniform [0, 1) in dtype from random mantissa bits: bits under the
    exponent of 1.0 give [1, 2), which is exact in every float format."""
    dtype = np.dtype(dtype)
    width = dtype.itemsize * 8
    uint = np.dtype(f"uint{width}")
    mantissa = ml_dtypes.finfo(dtype).nmant
    bits = random_bits(key, shape, width, stream)
    bits = ew.shift_right_p.bind(bits, np.asarray(width - mantissa, uint))
    one_bits = np.asarray(np.ones((), dtype).view(uint), uint)
    bits = ew.or_p.bind(bits, one_bits)
    if shape == ():
        # bitcast's kernel turns 0-d arrays 1-d (np.ascontiguousarray).
        bits = reshape_p.bind(bits, new_shape=(1,))
        floats = bitcast_convert_type_p.bind(bits, dtype=dtype)
        return _sub(reshape_p.bind(floats, new_shape=()), 1)
    return _sub(bitcast_convert_type_p.bind(bits, dtype=dtype), 1)


def _open_uniform(key, shape, dtype, stream=0):
    """Uniform (0, 1): logs and inverse CDFs never see 0."""
    u = _unit_uniform(key, shape, dtype, stream)
    tiny = ml_dtypes.finfo(dtype).tiny
    return ew.max_p.bind(u, np.asarray(tiny, dtype))


def _standard_normal(key, shape, dtype, stream=0):
    """N(0, 1) by the inverse CDF: sqrt(2) * erfinv(u), u in (-1, 1)."""
    u = _unit_uniform(key, shape, dtype, stream)
    u = _sub(_mul(u, 2), 1)
    lowest = np.nextafter(np.asarray(-1, dtype), np.asarray(0, dtype))
    u = ew.max_p.bind(u, lowest)
    return _mul(special.erfinv_p.bind(u), math.sqrt(2))


def _float_dtype(dtype):
    dtype = standardize_dtype(dtype or floatx())
    return dtype, np_dtype(dtype)


def _param(x, dtype):
    """A distribution parameter (number, list or tensor) as a dtype operand."""
    if _is_array(x):
        return _cast(x, dtype)
    return np.asarray(x, dtype=dtype)


def _finish(x, mean, stddev, out_dtype, work):
    x = _add(_mul(x, _param(stddev, work)), _param(mean, work))
    return _cast(x, out_dtype)


# ---------------------------------------------------------------- samplers
def normal(shape, mean=0.0, stddev=1.0, dtype=None, seed=None):
    _, out = _float_dtype(dtype)
    work = _compute_dtype(out)
    x = _standard_normal(_key(seed), _shape(shape), work)
    return _finish(x, mean, stddev, out, work)


def uniform(shape, minval=0.0, maxval=1.0, dtype=None, seed=None):
    name, out = _float_dtype(dtype)
    u = _unit_uniform(_key(seed), _shape(shape), out)
    lo = _param(minval, out)
    hi = _param(maxval, out)
    x = _add(_mul(u, _sub(hi, lo)), lo)
    # Rounding of u * (hi - lo) may reach hi; keep the interval half-open.
    x = ew.min_p.bind(x, ew.nextafter_p.bind(hi, lo))
    return ew.max_p.bind(x, lo)


def truncated_normal(shape, mean=0.0, stddev=1.0, dtype=None, seed=None):
    """Normal truncated to two standard deviations, by inverse CDF over the
    kept interval (no rejection, so the cost is fixed)."""
    _, out = _float_dtype(dtype)
    work = _compute_dtype(out)
    edge = math.erf(2 / math.sqrt(2))
    u = _unit_uniform(_key(seed), _shape(shape), work)
    u = _sub(_mul(u, 2 * edge), edge)
    x = _mul(special.erfinv_p.bind(u), math.sqrt(2))
    x = ew.clamp_p.bind(np.asarray(-2, work), x, np.asarray(2, work))
    return _finish(x, mean, stddev, out, work)


def categorical(logits, num_samples, dtype="int32", seed=None):
    logits = convert_to_tensor(logits)
    if logits.dtype.kind != "f":
        logits = _cast(logits, np.float32)
    work = _compute_dtype(logits.dtype)
    logits = _cast(logits, work)
    if len(logits.shape) != 2:
        raise ValueError(
            "`logits` must be 2-D (batch_size, num_classes); got shape "
            f"{tuple(logits.shape)}."
        )
    batch, classes = logits.shape
    num_samples = int(num_samples)
    u = _open_uniform(_key(seed), (batch, num_samples, classes), work)
    # Gumbel-max: argmax(logits + G) is a draw from softmax(logits).
    gumbel = ew.neg_p.bind(ew.log_p.bind(ew.neg_p.bind(ew.log_p.bind(u))))
    scores = _add(reshape_p.bind(logits, new_shape=(batch, 1, classes)), gumbel)
    index_dtype = np.dtype(np.int64 if classes and classes > 2**31 - 1 else np.int32)
    idx = argmax_p.bind(scores, axis=2, index_dtype=index_dtype)
    return _cast(idx, np_dtype(dtype))


def randint(shape, minval, maxval, dtype="int32", seed=None):
    """minval + (64 random bits mod span): the modulo bias is below
    span / 2**64."""
    out = np_dtype(dtype)
    shape = _shape(shape)
    bits = random_bits(_key(seed), shape, 64)
    lo = _param(minval, np.int64)
    hi = _param(maxval, np.int64)
    span = ew.max_p.bind(_sub(hi, lo), np.asarray(1, np.int64))
    offset = ew.rem_p.bind(bits, _cast(span, np.uint64))
    return _cast(_add(_cast(offset, np.int64), lo), out)


def dropout(inputs, rate, noise_shape=None, seed=None):
    inputs = convert_to_tensor(inputs)
    if not _is_array(rate):
        if rate == 1.0:
            return _mul(inputs, 0)
        if rate == 0.0:
            return inputs
    dtype = inputs.dtype
    work = dtype if dtype.kind == "f" else np.dtype(np.float32)
    if noise_shape is None:
        noise_shape = inputs.shape
    else:
        noise_shape = tuple(
            inputs.shape[i] if d is None else d for i, d in enumerate(noise_shape)
        )
    keep = _sub(np.asarray(1, work), _param(rate, work))
    # The mask is drawn in float32 whatever the input dtype, so one seed
    # drops the same elements of a float16 and a float32 tensor.
    u = _unit_uniform(_key(seed), _shape(noise_shape), np.float32)
    mask = ew.lt_p.bind(u, _cast(keep, np.float32))
    scaled = _cast(_div(_cast(inputs, work), keep), dtype)
    return _select(mask, scaled, 0)


def shuffle(x, axis=0, seed=None):
    """Each 1-D slice along `axis` is permuted independently (as the JAX and
    NumPy backends do): x rides along a sort by random keys."""
    x = convert_to_tensor(x)
    if len(x.shape) == 0:
        return x
    axis = axis % len(x.shape)
    keys = random_bits(_key(seed), _shape(x.shape), 32)
    _, shuffled = sort_p.bind(keys, x, dimension=axis, num_keys=1)
    return shuffled


def _gamma(key, shape, alpha, work, stream=0):
    """Gamma(alpha, 1) by Marsaglia-Tsang. alpha < 1 is boosted:
    Gamma(a) = Gamma(a + 1) * U**(1/a). Uses streams stream..stream+2R."""
    alpha = _param(alpha, work)
    small = ew.lt_p.bind(alpha, np.asarray(1, work))
    boosted = _select(small, _add(alpha, 1), alpha)
    d = _sub(boosted, 1 / 3)
    c = ew.rsqrt_p.bind(_mul(d, 9))
    result = None
    # Walk the rounds backwards so the first accepted round wins.
    for r in reversed(range(_GAMMA_ROUNDS)):
        x = _standard_normal(key, shape, work, stream + 2 * r)
        u = _open_uniform(key, shape, work, stream + 2 * r + 1)
        v = _add(_mul(c, x), 1)
        v3 = _mul(_mul(v, v), v)
        positive = ew.gt_p.bind(v3, np.asarray(0, work))
        safe_v3 = _select(positive, v3, 1)
        bound = _add(
            _mul(_mul(x, x), 0.5),
            _mul(d, _add(_sub(1, safe_v3), ew.log_p.bind(safe_v3))),
        )
        accept = ew.and_p.bind(positive, ew.lt_p.bind(ew.log_p.bind(u), bound))
        sample = _mul(d, safe_v3)
        result = _select(accept, sample, d if result is None else result)
    boost_u = _open_uniform(key, shape, work, stream + 2 * _GAMMA_ROUNDS)
    log_boost = _div(ew.log_p.bind(boost_u), alpha)
    log_boost = _select(small, log_boost, 0)
    return ew.exp_p.bind(_add(ew.log_p.bind(result), log_boost))


def gamma(shape, alpha, dtype=None, seed=None):
    _, out = _float_dtype(dtype)
    work = _compute_dtype(out)
    return _cast(_gamma(_key(seed), _shape(shape), alpha, work), out)


def beta(shape, alpha, beta, dtype=None, seed=None):
    _, out = _float_dtype(dtype)
    work = _compute_dtype(out)
    key = _key(seed)
    shape = _shape(shape)
    x = _gamma(key, shape, alpha, work, stream=0)
    y = _gamma(key, shape, beta, work, stream=2 * _GAMMA_ROUNDS + 1)
    return _cast(_div(x, _add(x, y)), out)


def _stirling_tail(k):
    """log(k!) minus Stirling's approximation of it, by its asymptotic
    series in 1/(k+1); at k < 10 the series is off by at most 2e-4, which
    only touches tail values BTRS rarely proposes."""
    k1 = _add(k, 1)
    inv = ew.reciprocal_p.bind(k1)
    inv2 = _mul(inv, inv)
    series = _mul(
        inv, _sub(1 / 12, _mul(inv2, _sub(1 / 360, _mul(inv2, 1 / 1260))))
    )
    return series


def _binomial_inversion(key, shape, n, p, work, stream):
    """Count of CDF terms below one uniform; exact for small means."""
    u = _open_uniform(key, shape, work, stream)
    pmf = ew.exp_p.bind(_mul(n, ew.log1p_p.bind(ew.neg_p.bind(p))))
    ratio = _div(p, _sub(1, p))
    cdf = pmf
    count = _mul(u, 0)
    for k in range(_INVERSION_TERMS):
        count = _add(count, _cast(ew.lt_p.bind(cdf, u), work))
        pmf = _mul(pmf, _mul(ratio, _div(_sub(n, k), k + 1)))
        cdf = _add(cdf, pmf)
    return ew.min_p.bind(count, n)


def _binomial_btrs(key, shape, n, p, work, stream):
    """BTRS, the transformed rejection sampler of Hormann (1993), for
    n * p >= 10 and p <= 0.5. The acceptance test uses Stirling tails so
    float32 keeps its precision for counts in the millions."""
    spq = ew.sqrt_p.bind(_mul(_mul(n, p), _sub(1, p)))
    b = _add(_mul(spq, 2.53), 1.15)
    a = _add(_add(_mul(b, 0.0248), -0.0873), _mul(p, 0.01))
    c = _add(_mul(n, p), 0.5)
    v_r = _sub(0.92, _div(4.2, b))
    alpha = _mul(_add(_div(5.1, b), 2.83), spq)
    r = _div(p, _sub(1, p))
    m = ew.floor_p.bind(_mul(_add(n, 1), p))
    log = ew.log_p.bind
    result = None
    for i in reversed(range(_BTRS_ROUNDS)):
        u = _sub(_unit_uniform(key, shape, work, stream + 2 * i), 0.5)
        v = _open_uniform(key, shape, work, stream + 2 * i + 1)
        us = _sub(0.5, ew.abs_p.bind(u))
        us = ew.max_p.bind(us, np.asarray(1e-6, work))
        k = ew.floor_p.bind(_add(_mul(_add(_div(_mul(a, 2), us), b), u), c))
        fast = ew.and_p.bind(
            ew.ge_p.bind(us, np.asarray(0.07, work)), ew.le_p.bind(v, v_r)
        )
        in_range = ew.and_p.bind(
            ew.ge_p.bind(k, np.asarray(0, work)), ew.le_p.bind(k, n)
        )
        ks = ew.clamp_p.bind(np.asarray(0, work), k, n)
        lv = log(_div(_mul(v, alpha), _add(_div(a, _mul(us, us)), b)))
        bound = _add(
            _add(
                _mul(_add(m, 0.5), log(_div(_add(m, 1), _mul(r, _add(_sub(n, m), 1))))),
                _mul(_add(n, 1), log(_div(_add(_sub(n, m), 1), _add(_sub(n, ks), 1)))),
            ),
            _mul(_add(ks, 0.5), log(_div(_mul(r, _add(_sub(n, ks), 1)), _add(ks, 1)))),
        )
        bound = _add(
            bound,
            _sub(
                _add(_stirling_tail(m), _stirling_tail(_sub(n, m))),
                _add(_stirling_tail(ks), _stirling_tail(_sub(n, ks))),
            ),
        )
        accept = ew.or_p.bind(
            fast, ew.and_p.bind(in_range, ew.le_p.bind(lv, bound))
        )
        fallback = ew.floor_p.bind(_mul(n, p)) if result is None else result
        result = _select(accept, ks, fallback)
    return result


def binomial(shape, counts, probabilities, dtype=None, seed=None):
    _, out = _float_dtype(dtype)
    work = _compute_dtype(out)
    key = _key(seed)
    shape = _shape(shape)
    n = _param(counts, work)
    p = _param(probabilities, work)
    # Sample the rarer outcome (q <= 0.5) and mirror: BTRS needs p <= 0.5.
    flip = ew.gt_p.bind(p, np.asarray(0.5, work))
    q = _select(flip, _sub(1, p), p)
    large = ew.ge_p.bind(_mul(n, q), np.asarray(_SMALL_MEAN, work))
    # Each branch sees parameters valid for it (no NaNs in the unused one).
    q_small = _select(large, 0.0, q)
    n_large = _select(large, n, 1000.0)
    q_large = _select(large, q, 0.5)
    small_draw = _binomial_inversion(key, shape, n, q_small, work, stream=1)
    large_draw = _binomial_btrs(key, shape, n_large, q_large, work, stream=2)
    draw = _select(large, large_draw, small_draw)
    draw = _select(flip, _sub(n, draw), draw)
    return _cast(draw, out)
