"""XLA's random number primitives, bit for bit where XLA defines the bits.

- rng_bit_generator(state; algorithm, shape, dtype) -> (new_state, bits):
  XLA's RngBitGenerator. "philox" (also XLA's CPU default) and "three_fry"
  follow XLA's expansion (xla/hlo/builder/lib/prng.cc and the
  rng_bit_generator expander): the same state gives the same bits as
  TensorFlow on CPU, so stateless random ops (Keras' dropout, initializers,
  tf.random.stateless_*) match TensorFlow. A pure function of its state.
- rng_stateful(token, a, b; distribution, shape) -> (token, values): XLA's
  `rng` (TensorFlow's stateful tf.random.uniform/normal), whose bits XLA
  leaves to the backend: drawn from the device's random stream, which
  `keras_ipu.utils.reset_ipu_seed` reseeds. It takes and returns the
  effect token of the front end (frontends/tensorflow/importer.py), so each
  draw happens once, in program order.
"""

import numpy as np

from keras_ipu.device.ir import ShapedArray
from keras_ipu.device.primitives.random_bits import philox4x32
from keras_ipu.device.primitives.registry import Primitive
from keras_ipu.device.simulator.numerics import DeviceRandomSource

ALGORITHMS = ("philox", "three_fry")

_M32 = np.uint64(0xFFFFFFFF)
_S32 = np.uint64(32)


def _split64(x):
    x = np.asarray(x, np.uint64)
    return (x & _M32).astype(np.uint32), (x >> _S32).astype(np.uint32)


def _join64(lo, hi):
    return np.asarray(lo, np.uint64) | (np.asarray(hi, np.uint64) << _S32)


# -- Philox (prng.cc: PhiloxBitGenerator) ---------------------------------------


def _philox_blocks(key, counter, n_blocks):
    """n_blocks Philox-4x32-10 blocks at counters counter + 0..n-1 (a
    128-bit counter as two uint64 words, low first); and the counter
    after them."""
    lo, hi = np.uint64(counter[0]), np.uint64(counter[1])
    index = np.arange(n_blocks, dtype=np.uint64)
    with np.errstate(over="ignore"):
        new_lo = lo + index
        carry = (new_lo < lo).astype(np.uint64)
        new_hi = hi + carry
        end_lo = lo + np.uint64(n_blocks)
        end_hi = hi + (np.uint64(1) if end_lo < lo else np.uint64(0))
    c0, c1 = _split64(new_lo)
    c2, c3 = _split64(new_hi)
    k0, k1 = _split64(key)
    blocks = philox4x32((c0, c1, c2, c3), (k0, k1))
    return blocks, (end_lo, end_hi)


def _philox(key, counter, shape, bits):
    n = int(np.prod(shape, dtype=np.int64))
    if bits == 64:
        blocks, end = _philox_blocks(key, counter, -(-2 * n // 4))
        w0 = _join64(blocks[0], blocks[1])
        w1 = _join64(blocks[2], blocks[3])
        out = np.stack([w0, w1], axis=1).reshape(-1)[:n]
    else:
        blocks, end = _philox_blocks(key, counter, -(-n // 4))
        out = blocks.T.reshape(-1)[:n]
        if bits < 32:
            out = out.astype(np.dtype(f"uint{bits}"))
    return out.reshape(shape), end


# -- ThreeFry (prng.cc: ThreeFryBitGenerator) -------------------------------------

_ROTATIONS = (13, 15, 26, 6, 17, 29, 16, 24)


def _rotl(v, d):
    return (v << np.uint32(d)) | (v >> np.uint32(32 - d))


def threefry2x32(x0, x1, k0, k1):
    """ThreeFry-2x32 with 20 rounds, as XLA computes it."""
    x0 = np.asarray(x0, np.uint32).copy()
    x1 = np.asarray(x1, np.uint32).copy()
    k0, k1 = np.uint32(k0), np.uint32(k1)
    ks = (k0, k1, np.uint32(0x1BD11BDA) ^ k0 ^ k1)
    with np.errstate(over="ignore"):
        x0 += ks[0]
        x1 += ks[1]
        for group in range(5):
            for r in _ROTATIONS[(group % 2) * 4:(group % 2) * 4 + 4]:
                x0 += x1
                x1 = _rotl(x1, r)
                x1 ^= x0
            x0 += ks[(group + 1) % 3]
            x1 += ks[(group + 2) % 3] + np.uint32(group + 1)
    return x0, x1


def _split_shape(shape):
    """XLA's SplitShapeIntoHalves: (half shape, split axis)."""
    if not shape:
        return (1,), 0
    axis = next((i for i, d in enumerate(shape) if d % 2 == 0), None)
    if axis is None:
        axis = int(np.argmax(shape))
    half = list(shape)
    half[axis] = -(-shape[axis] // 2)
    return tuple(half), axis


def _threefry_inputs(state, n):
    with np.errstate(over="ignore"):
        words = np.uint64(state) + np.arange(n, dtype=np.uint64)
        end = np.uint64(state) + np.uint64(n)
    return _split64(words), end


def _threefry(key, state, shape, bits):
    k0, k1 = _split64(key)
    if bits == 64:
        n = int(np.prod(shape, dtype=np.int64))
        (x0, x1), end = _threefry_inputs(state, n)
        y0, y1 = threefry2x32(x0, x1, k0, k1)
        return _join64(y0, y1).reshape(shape), end
    half, axis = _split_shape(tuple(shape))
    n = int(np.prod(half, dtype=np.int64))
    (x0, x1), end = _threefry_inputs(state, n)
    y0, y1 = threefry2x32(x0, x1, k0, k1)
    # The two halves interleave along the split axis.
    both = np.stack([y0.reshape(half), y1.reshape(half)], axis=axis + 1)
    full = list(half)
    full[axis] *= 2
    out = both.reshape(full)
    if shape:
        out = out[tuple(slice(0, d) for d in shape)]
    else:
        out = out.reshape(-1)[:1].reshape(())
    if bits < 32:
        out = out.astype(np.dtype(f"uint{bits}"))
    return np.ascontiguousarray(out), end


# -- the primitive -------------------------------------------------------------------


def _check(state, algorithm, shape, dtype):
    if algorithm not in ALGORITHMS:
        raise ValueError(
            f"rng_bit_generator: algorithm {algorithm!r} is not one of {ALGORITHMS}."
        )
    if state.dtype != np.uint64 or len(state.shape) != 1:
        raise TypeError(
            f"rng_bit_generator: the state must be a uint64 vector, got {state.short()}."
        )
    n = state.shape[0]
    need = 3 if algorithm == "philox" else 2
    if n is not None and n < (2 if algorithm == "philox" else need):
        raise ValueError(
            f"rng_bit_generator: a {algorithm} state needs at least "
            f"{2 if algorithm == 'philox' else need} words, got {n}."
        )
    dtype = np.dtype(dtype)
    if dtype.kind not in "uif" or dtype.itemsize not in (1, 2, 4, 8):
        raise TypeError(f"rng_bit_generator: cannot generate bits of dtype {dtype}.")


def _rule(state, *, algorithm, shape, dtype):
    _check(state, algorithm, shape, dtype)
    return (ShapedArray(state.shape, state.dtype), ShapedArray(tuple(shape), dtype))


def _kernel(state, *, algorithm, shape, dtype):
    dtype = np.dtype(dtype)
    bits = dtype.itemsize * 8
    state = np.asarray(state, np.uint64)
    key = state[0]
    shape = tuple(int(d) for d in shape)
    if algorithm == "philox":
        counter = state[1:3] if state.shape[0] >= 3 else state[::-1][:2]
        out, end = _philox(key, counter, shape, bits)
        new = [end[0], end[1]] if state.shape[0] >= 3 else [end[0]]
    else:
        out, end = _threefry(key, state[1], shape, bits)
        new = [end]
    new_state = np.concatenate([state[:1], np.asarray(new, np.uint64),
                                state[1 + len(new):]])
    unsigned = np.dtype(f"uint{bits}")
    out = np.asarray(out, unsigned)
    if dtype != unsigned:
        out = out.view(dtype)
    return new_state, out


rng_bit_generator_p = Primitive(
    "rng_bit_generator", _rule, _kernel, multiple_results=True,
    nondiff="random bits do not depend differentiably on the state",
    doc="XLA's RngBitGenerator (philox, three_fry), bit-exact.",
)


# -- stateful draws (XLA's `rng`) ---------------------------------------------------

_SOURCE = DeviceRandomSource(stream=0x2A6)


def _source():
    return _SOURCE.generator()


def _stateful_rule(token, a, b, *, distribution, shape):
    if distribution not in ("uniform", "normal"):
        raise ValueError(f"rng_stateful: distribution {distribution!r} is not uniform or normal.")
    if a.dtype != b.dtype:
        raise TypeError(f"rng_stateful: bounds {a.short()} and {b.short()} differ in dtype.")
    return (ShapedArray(token.shape, token.dtype), ShapedArray(tuple(shape), a.dtype))


def _stateful(token, a, b, *, distribution, shape):
    gen = _source()
    dtype = np.asarray(a).dtype
    shape = tuple(int(d) for d in shape)
    if distribution == "normal":
        out = np.asarray(a) + np.asarray(b) * gen.standard_normal(shape)
    elif dtype.kind in "iu":
        out = gen.integers(np.asarray(a), np.asarray(b), size=shape, endpoint=False)
    else:
        out = np.asarray(a) + (np.asarray(b) - np.asarray(a)) * gen.random(shape)
    with np.errstate(over="ignore"):
        new_token = np.asarray(token + 1, np.asarray(token).dtype)
    return new_token, np.asarray(out).astype(dtype)


rng_stateful_p = Primitive(
    "rng_stateful", _stateful_rule, _stateful, multiple_results=True,
    nondiff="random draws",
    doc="XLA's rng: uniform/normal draws from the device's random stream, ordered by the effect token.",
)


# -- cost rules (formulas and constants: keras_ipu/device/simulator/cost_model.py)
from keras_ipu.device.primitives import cost_util as _cost  # noqa: E402
from keras_ipu.device.simulator import cost_model as _cost_model  # noqa: E402


def _random_cost(ins, outs, **params):
    words = -(-_cost.nbytes(outs[-1]) // 4)
    return _cost.make(ins, outs, "random", words * _cost_model.RANDOM_FLOPS_PER_32_BITS)


rng_bit_generator_p.cost = _random_cost
rng_stateful_p.cost = _random_cost
