"""TensorFlow rule of random_bits: the same Philox-4x32-10 stream as the
NumPy kernel (primitives/random_bits.py), so both engines draw the same
bits for the same key."""

import numpy as np
import tensorflow as tf

from keras_ipu.device.primitives import random_bits as _rb
from keras_ipu.device.to_tensorflow.emitter import rule

_LOW32 = 0xFFFFFFFF


def _mulhilo(multiplier, x):
    product = tf.cast(x, tf.uint64) * tf.constant(int(multiplier), tf.uint64)
    high = tf.cast(tf.bitwise.right_shift(product, tf.constant(32, tf.uint64)), tf.uint32)
    low = tf.cast(tf.bitwise.bitwise_and(product, tf.constant(_LOW32, tf.uint64)), tf.uint32)
    return high, low


def philox_words(key, n_words, stream=0):
    """The first n_words uint32 words of key's stream (key: uint32[2])."""
    n_blocks = -(-n_words // 4)
    index = np.arange(n_blocks, dtype=np.uint64)
    c0 = tf.constant((index & _LOW32).astype(np.uint32))
    c1 = tf.constant((index >> np.uint64(32)).astype(np.uint32))
    c2 = tf.fill([n_blocks], tf.constant(stream & _LOW32, tf.uint32))
    c3 = tf.fill([n_blocks], tf.constant(stream >> 32, tf.uint32))
    k0, k1 = key[0], key[1]
    w0 = tf.constant(int(_rb.PHILOX_W0), tf.uint32)
    w1 = tf.constant(int(_rb.PHILOX_W1), tf.uint32)
    for r in range(_rb.PHILOX_ROUNDS):
        if r:
            k0, k1 = k0 + w0, k1 + w1
        hi0, lo0 = _mulhilo(_rb.PHILOX_M0, c0)
        hi1, lo1 = _mulhilo(_rb.PHILOX_M1, c2)
        c0, c1, c2, c3 = (
            tf.bitwise.bitwise_xor(tf.bitwise.bitwise_xor(hi1, c1), k0),
            lo1,
            tf.bitwise.bitwise_xor(tf.bitwise.bitwise_xor(hi0, c3), k1),
            lo0,
        )
    words = tf.reshape(tf.stack([c0, c1, c2, c3], axis=1), [-1])
    return words[:n_words]


@rule("random_bits")
def _random_bits(ctx, key, *, shape, bit_width, stream=0):
    key = tf.reshape(key, [2])
    size = int(np.prod(shape, dtype=np.int64))
    if bit_width == 64:
        words = tf.reshape(tf.cast(philox_words(key, 2 * size, stream), tf.uint64), [size, 2])
        bits = tf.bitwise.bitwise_or(
            tf.bitwise.left_shift(words[:, 0], tf.constant(32, tf.uint64)), words[:, 1])
    else:
        bits = tf.cast(philox_words(key, size, stream), tf.as_dtype(f"uint{bit_width}"))
    return tf.reshape(bits, shape)
