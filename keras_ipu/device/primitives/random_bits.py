"""random_bits: a counter-based, stateless random number generator.

`random_bits_p.bind(key, shape=(...), bit_width=32)` returns uniformly
random unsigned integers (uint8/16/32/64) of the given shape, determined
only by `key` (uint32[2]) and the shape, like `jax.random.bits`. Nothing is
kept between calls: the same key gives the same bits, so a compiled step
stays a pure function of its inputs (the seed travels in the state).

The generator is Philox-4x32-10 (Salmon et al., "Parallel random numbers:
as easy as 1, 2, 3", SC'11), the counter-based generator that TensorFlow,
PyTorch and cuRAND use: each 128-bit counter block is encrypted under the
64-bit key with ten rounds of multiply/xor/add, which vectorises over all
counters at once. Element i of the flattened output takes word i of the
stream, i.e. word i % 4 of block i // 4 (counter = (i//4 low, high, 0, 0)).

`stream` (a static int, default 0) selects one of 2**64 disjoint streams of
the same key (it fills the upper counter words), so one seed can feed the
several independent draws a sampler needs (gamma's rejection rounds, ...)
without deriving new keys.
"""

import numpy as np

from keras_ipu.device.ir import ShapedArray
from keras_ipu.device.primitives.registry import Primitive
from keras_ipu.device.trace import Tracer
from keras_ipu.device.trace import current_builder

# Round multipliers and Weyl key increments of Philox-4x32 (Random123).
PHILOX_M0 = np.uint64(0xD2511F53)
PHILOX_M1 = np.uint64(0xCD9E8D57)
PHILOX_W0 = np.uint32(0x9E3779B9)
PHILOX_W1 = np.uint32(0xBB67AE85)
PHILOX_ROUNDS = 10

_BIT_WIDTHS = (8, 16, 32, 64)
_LOW32 = np.uint64(0xFFFFFFFF)
_SHIFT32 = np.uint64(32)


def _mulhilo(multiplier, x):
    """(high, low) 32-bit halves of the 64-bit product multiplier * x."""
    product = x.astype(np.uint64) * multiplier
    return (
        (product >> _SHIFT32).astype(np.uint32),
        (product & _LOW32).astype(np.uint32),
    )


def philox4x32(counters, key, rounds=PHILOX_ROUNDS):
    """Encrypt counter blocks. counters: uint32[4, n]; key: uint32[2].

    Returns uint32[4, n]. Exposed for known-answer tests.
    """
    c0, c1, c2, c3 = (np.asarray(c, np.uint32) for c in counters)
    k0 = np.uint32(key[0])
    k1 = np.uint32(key[1])
    with np.errstate(over="ignore"):
        for r in range(rounds):
            if r:
                k0 = np.uint32(k0 + PHILOX_W0)
                k1 = np.uint32(k1 + PHILOX_W1)
            hi0, lo0 = _mulhilo(PHILOX_M0, c0)
            hi1, lo1 = _mulhilo(PHILOX_M1, c2)
            c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
    return np.stack([c0, c1, c2, c3])


def _philox_stream(key, n_words, stream=0):
    """The first n_words uint32 words of key's stream number `stream`."""
    n_blocks = -(-n_words // 4)
    index = np.arange(n_blocks, dtype=np.uint64)
    counters = (
        (index & _LOW32).astype(np.uint32),
        (index >> _SHIFT32).astype(np.uint32),
        np.full(n_blocks, stream & 0xFFFFFFFF, np.uint32),
        np.full(n_blocks, stream >> 32, np.uint32),
    )
    blocks = philox4x32(counters, key)
    # Word order within a block follows the block order: w0 w1 w2 w3.
    return blocks.T.reshape(-1)[:n_words]


def _check_key(key):
    if key.dtype != np.uint32 or tuple(key.shape) not in ((2,), (None,)):
        raise TypeError(
            "random_bits: the key must be a uint32 tensor of shape (2,) (a "
            f"Keras seed state), got {key.dtype} with shape {tuple(key.shape)}."
            " Pass `keras.random.SeedGenerator(seed)` or an int seed."
        )


def _check_params(shape, bit_width, stream):
    if not isinstance(stream, (int, np.integer)) or not 0 <= stream < 2**64:
        raise ValueError(
            f"random_bits: stream must be an integer in [0, 2**64), got "
            f"{stream!r}."
        )
    if bit_width not in _BIT_WIDTHS:
        raise ValueError(
            f"random_bits: bit_width must be one of {_BIT_WIDTHS}, got "
            f"{bit_width!r}."
        )
    for d in shape:
        if d is not None and (not isinstance(d, (int, np.integer)) or d < 0):
            raise ValueError(
                f"random_bits: shape {tuple(shape)} must hold non-negative "
                "integers (or None while traced)."
            )


def _random_bits_rule(key, *, shape, bit_width, stream=0):
    _check_key(key)
    _check_params(shape, bit_width, stream)
    return ShapedArray(tuple(shape), np.dtype(f"uint{bit_width}"))


def _random_bits(key, *, shape, bit_width, stream=0):
    _check_params(shape, bit_width, stream)
    if None in shape:
        raise ValueError(
            f"random_bits: shape {tuple(shape)} has unknown (None) dimensions; "
            "a concrete shape is needed to draw numbers."
        )
    key = np.asarray(key, np.uint32).reshape(-1)
    size = int(np.prod(shape, dtype=np.int64))
    if bit_width == 64:
        words = _philox_stream(key, 2 * size, stream).reshape(size, 2).astype(np.uint64)
        bits = (words[:, 0] << _SHIFT32) | words[:, 1]
    else:
        # Narrow widths keep the low bits of one word each.
        bits = _philox_stream(key, size, stream).astype(np.dtype(f"uint{bit_width}"))
    return bits.reshape(shape)


random_bits_p = Primitive(
    "random_bits",
    _random_bits_rule,
    _random_bits,
    runtime_value=True,
    nondiff="random integers do not depend differentiably on the key",
    doc="Uniform random unsigned integers from a Philox-4x32-10 key.",
)


def random_bits(key, shape, bit_width=32, stream=0):
    """Bind random_bits; traced whenever a trace is open and the shape has
    unknown dims, even with a concrete key (an int seed inside a symbolic
    Keras call): such a shape has no eager value to draw."""
    params = dict(shape=tuple(shape), bit_width=bit_width, stream=stream)
    if None in params["shape"] and not isinstance(key, Tracer):
        builder = current_builder()
        if builder is not None:
            return random_bits_p.bind_traced(builder, key, **params)
    return random_bits_p.bind(key, **params)


# -- cost rules (formulas and constants: keras_ipu/device/simulator/cost_model.py)
from keras_ipu.device.primitives import cost_util as _cost  # noqa: E402
from keras_ipu.device.simulator import cost_model as _cost_model  # noqa: E402


def _random_bits_cost(ins, outs, *, shape, bit_width, stream=0):
    words = -(-_cost.size(outs[0]) * bit_width // 32)
    return _cost.make(ins, outs, "random", words * _cost_model.RANDOM_FLOPS_PER_32_BITS)


random_bits_p.cost = _random_bits_cost
