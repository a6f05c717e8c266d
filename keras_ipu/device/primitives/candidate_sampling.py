"""Candidate sampling: the log-uniform (Zipfian) sampler of sampled losses.

- log_uniform_candidates(token, true_classes; num_sampled, unique,
  range_max) -> (token, sampled [num_sampled] int64, true_expected_count
  [batch, num_true] float32, sampled_expected_count [num_sampled] float32):
  TensorFlow's LogUniformCandidateSampler (core/kernels/range_sampler.cc,
  LogUniformSampler and RangeSampler::SampleBatchGetExpectedCountAvoid).
  A class k in [0, range_max) has probability
      P(k) = log((k + 2) / (k + 1)) / log(range_max + 1),
  drawn as floor(exp(u * log(range_max + 1))) - 1 for u uniform in [0, 1).
  With `unique` the draws are repeated until num_sampled distinct classes
  are picked, and a class's expected count is 1 - (1 - P)^tries (tries:
  the draws it took), else P * num_sampled, as TensorFlow computes them
  (float32). The draws come from a random stream of the device, which
  `keras_ipu.utils.reset_ipu_seed` reseeds (TensorFlow's own kernel uses
  its op's Philox stream, so the samples are TensorFlow's in distribution,
  not bit for bit). It takes and returns the effect token of the front end,
  so each sampling happens once, in program order.
"""

import numpy as np

from keras_ipu.device.ir import ShapedArray
from keras_ipu.device.primitives.registry import Primitive
from keras_ipu.device.simulator.numerics import DeviceRandomSource

# A stream of its own: a seed reset gives the sampler the same draws
# whatever other random ops the program holds.
_SOURCE = DeviceRandomSource(stream=0xCA5D)


def log_uniform_probability(classes, range_max):
    """P(k) of the log-uniform distribution over [0, range_max), float32
    (computed in float64 and rounded, as TensorFlow's sampler does)."""
    k = np.asarray(classes, np.float64)
    return (np.log((k + 2.0) / (k + 1.0)) / np.log1p(range_max)).astype(np.float32)


def expected_counts(probability, num_sampled, tries):
    """TensorFlow's ExpectedCountHelper, in float32: P * num_sampled when
    every draw was kept, else 1 - (1 - P)^tries."""
    p = np.asarray(probability, np.float32)
    if tries == num_sampled:
        return p * np.float32(num_sampled)
    return -np.expm1(np.float32(tries) * np.log1p(-p))


def _check(true_classes, num_sampled, unique, range_max):
    if true_classes.dtype != np.int64 or len(true_classes.shape) != 2:
        raise TypeError("log_uniform_candidates: true_classes must be an int64 matrix "
                        f"[batch_size, num_true], got {true_classes.short()}.")
    if num_sampled < 1 or range_max < 1:
        raise ValueError(f"log_uniform_candidates: num_sampled ({num_sampled}) and range_max "
                         f"({range_max}) must be positive.")
    if unique and num_sampled > range_max:
        raise ValueError(
            f"Sampler's range is too small: {num_sampled} unique classes cannot be drawn "
            f"from range_max={range_max}; sample fewer or set unique=False.")


def _rule(token, true_classes, *, num_sampled, unique, range_max):
    _check(true_classes, num_sampled, unique, range_max)
    return (ShapedArray(token.shape, token.dtype),
            ShapedArray((num_sampled,), np.int64),
            ShapedArray(true_classes.shape, np.float32),
            ShapedArray((num_sampled,), np.float32))


def _draw(gen, n, range_max):
    u = gen.random(n)
    return (np.exp(u * np.log1p(range_max)).astype(np.int64) - 1) % range_max


def _kernel(token, true_classes, *, num_sampled, unique, range_max):
    gen = _SOURCE.generator()
    if unique:
        picked, seen, tries = [], set(), 0
        while len(picked) < num_sampled:
            # Draws in blocks (one Python step per draw would be slow for
            # large samples); the tries count stops at the last one kept.
            for value in _draw(gen, 2 * (num_sampled - len(picked)), range_max):
                tries += 1
                if value not in seen:
                    seen.add(value)
                    picked.append(value)
                    if len(picked) == num_sampled:
                        break
        sampled = np.asarray(picked, np.int64)
    else:
        sampled = _draw(gen, num_sampled, range_max)
        tries = num_sampled
    true = expected_counts(log_uniform_probability(true_classes, range_max), num_sampled, tries)
    drawn = expected_counts(log_uniform_probability(sampled, range_max), num_sampled, tries)
    with np.errstate(over="ignore"):
        new_token = np.asarray(token + 1, np.asarray(token).dtype)
    return new_token, sampled, true.astype(np.float32), drawn.astype(np.float32)


log_uniform_candidates_p = Primitive(
    "log_uniform_candidates", _rule, _kernel, multiple_results=True,
    nondiff="sampled classes and their expected counts do not depend on the true classes "
            "differentiably",
    doc="TensorFlow's log-uniform candidate sampler, drawn from the device's random stream.",
)


# -- cost rule (formulas and constants: keras_ipu/device/simulator/cost_model.py)
from keras_ipu.device.primitives import cost_util as _cost  # noqa: E402
from keras_ipu.device.simulator import cost_model as _cost_model  # noqa: E402


def _sampler_cost(ins, outs, *, num_sampled, unique, range_max):
    # One 32-bit random word and one exp per draw (num_sampled draws: the
    # fewest a unique sample takes, the number a sample with repeats
    # takes), two logs per expected count.
    counts = _cost.size(outs[2]) + _cost.size(outs[3])
    flops = num_sampled * (_cost_model.RANDOM_FLOPS_PER_32_BITS
                           + _cost_model.TRANSCENDENTAL_FLOPS) \
        + 2 * counts * _cost_model.TRANSCENDENTAL_FLOPS
    return _cost.make(ins, outs, "random", flops)


log_uniform_candidates_p.cost = _sampler_cost
