"""random_bits: Philox-4x32-10 known answers, shape rule, determinism and
uniformity of the bits."""

import numpy as np
import pytest

from keras_ipu.device.array import Tensor
from keras_ipu.device.ir import ShapedArray
from keras_ipu.device.primitives.random_bits import philox4x32
from keras_ipu.device.primitives.random_bits import random_bits
from keras_ipu.device.primitives.random_bits import random_bits_p
from keras_ipu.device.trace import GraphBuilder
from keras_ipu.device.trace import tracing

KEY = np.array([1234, 5678], np.uint32)

# Known-answer vectors of Random123 (kat_vectors, philox4x32_10):
# (counter words, key words, expected output words).
PHILOX_KAT = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    (
        (0xFFFFFFFF,) * 4,
        (0xFFFFFFFF,) * 2,
        (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD),
    ),
    (
        (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
        (0xA4093822, 0x299F31D0),
        (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1),
    ),
]


def bits(key=KEY, shape=(8,), bit_width=32, stream=0):
    return np.asarray(random_bits_p.bind(key, shape=shape, bit_width=bit_width, stream=stream))


@pytest.mark.parametrize("counter,key,expected", PHILOX_KAT)
def test_philox_known_answers(counter, key, expected):
    counters = [np.array([c], np.uint32) for c in counter]
    out = philox4x32(counters, np.array(key, np.uint32))
    assert [int(w[0]) for w in out] == list(expected)


def test_stream_is_philox_blocks_in_order():
    # Word i of the stream is word i % 4 of block i // 4 (counter i // 4).
    out = bits(KEY, (8,))
    blocks = philox4x32(
        [np.array([0, 1], np.uint32), np.zeros(2, np.uint32),
         np.zeros(2, np.uint32), np.zeros(2, np.uint32)],
        KEY,
    )
    np.testing.assert_array_equal(out, blocks.T.reshape(-1))


def test_stream_param_fills_upper_counter_words():
    out = bits(KEY, (4,), stream=(7 << 32) | 3)
    block = philox4x32(
        [np.array([0], np.uint32), np.array([0], np.uint32),
         np.array([3], np.uint32), np.array([7], np.uint32)],
        KEY,
    )
    np.testing.assert_array_equal(out, block[:, 0])


@pytest.mark.parametrize("bit_width", [8, 16, 32, 64])
def test_shape_rule_matches_kernel(bit_width):
    out = random_bits_p.bind(KEY, shape=(3, 5), bit_width=bit_width)
    rule = random_bits_p.shape_rule(
        ShapedArray((2,), np.uint32), shape=(3, 5), bit_width=bit_width
    )
    assert isinstance(out, Tensor)
    assert out.shape == rule.shape == (3, 5)
    assert out.dtype == rule.dtype == np.dtype(f"uint{bit_width}")


def test_traced_with_unknown_dim():
    builder = GraphBuilder()
    key = builder.new_input(ShapedArray((2,), np.uint32))
    with tracing(builder):
        out = random_bits(key, (None, 4), 16)
    assert out.shape == (None, 4)
    assert out.dtype == np.uint16
    assert builder.graph.nodes[-1].primitive is random_bits_p


def test_traced_unknown_dim_with_concrete_key():
    # An int seed (concrete key) inside a symbolic call: still recorded.
    builder = GraphBuilder()
    with tracing(builder):
        out = random_bits(np.array([1, 2], np.uint32), (None,), 32)
    assert out.shape == (None,)
    assert builder.graph.nodes[-1].primitive is random_bits_p


def test_64_bit_words_are_pairs_of_32_bit_words():
    wide = bits(KEY, (5,), 64)
    narrow = bits(KEY, (10,), 32).astype(np.uint64).reshape(5, 2)
    np.testing.assert_array_equal(wide, (narrow[:, 0] << np.uint64(32)) | narrow[:, 1])


def test_narrow_widths_keep_low_bits():
    np.testing.assert_array_equal(bits(KEY, (6,), 8), bits(KEY, (6,), 32) & 0xFF)


def test_deterministic_and_key_sensitive():
    a = bits(KEY, (1000,))
    np.testing.assert_array_equal(a, bits(KEY, (1000,)))
    for other in ([1234, 5679], [1235, 5678]):
        b = bits(np.array(other, np.uint32), (1000,))
        # Unrelated streams agree on about 1000 / 2**32 words.
        assert np.sum(a == b) <= 1
    c = bits(KEY, (1000,), stream=1)
    assert np.sum(a == c) <= 1


def test_shape_prefix_and_layout():
    a = bits(KEY, (12,))
    np.testing.assert_array_equal(bits(KEY, (3, 4)).reshape(-1), a)
    np.testing.assert_array_equal(bits(KEY, (5,)), a[:5])


def test_bytes_pass_chi_square():
    # 2**16 samples of the top byte over 256 cells: df = 255, the 0.1% and
    # 99.9% quantiles of chi2(255) are about 190 and 330.
    top = bits(KEY, (1 << 16,)) >> np.uint32(24)
    counts = np.bincount(top, minlength=256)
    expected = (1 << 16) / 256
    chi2 = np.sum((counts - expected) ** 2 / expected)
    assert 190 < chi2 < 330, chi2


def test_every_bit_is_fair():
    words = bits(np.array([0, 0], np.uint32), (1 << 15,))
    ones = np.array([np.mean((words >> np.uint32(i)) & np.uint32(1)) for i in range(32)])
    # 5 standard deviations of a fair coin's mean over 2**15 draws.
    assert np.all(np.abs(ones - 0.5) < 5 * 0.5 / np.sqrt(1 << 15)), ones


def test_successive_words_uncorrelated():
    u = bits(KEY, (1 << 15,)).astype(np.float64)
    r = np.corrcoef(u[:-1], u[1:])[0, 1]
    assert abs(r) < 5 / np.sqrt(1 << 15)


@pytest.mark.parametrize(
    "key,kwargs,match",
    [
        (np.array([1, 2], np.int32), dict(shape=(2,), bit_width=32), "uint32"),
        (np.array([1, 2, 3], np.uint32), dict(shape=(2,), bit_width=32), "shape"),
        (KEY, dict(shape=(2,), bit_width=12), "bit_width"),
        (KEY, dict(shape=(-1,), bit_width=32), "non-negative"),
    ],
)
def test_errors_name_the_problem(key, kwargs, match):
    with pytest.raises((TypeError, ValueError), match=match):
        random_bits_p.shape_rule(ShapedArray(key.shape, key.dtype), **kwargs)
