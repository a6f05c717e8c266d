"""keras_ipu.backend.nn against NumPy references, brute force and
hand-computed values; every op also traced with an unknown batch size."""

import itertools
import math

import numpy as np
import pytest

from keras.src.backend.common.keras_tensor import KerasTensor

from keras_ipu.backend import core
from keras_ipu.backend import nn

RNG = np.random.default_rng(1)


def _np(x):
    return np.asarray(x)


def _sigmoid(x):
    return 1 / (1 + np.exp(-x))


ACTIVATIONS = {
    "relu": lambda x: np.maximum(x, 0),
    "relu6": lambda x: np.clip(x, 0, 6),
    "sigmoid": _sigmoid,
    "sparse_sigmoid": lambda x: np.clip(0.5 * (x + 1), 0, 1),
    "tanh": np.tanh,
    "tanh_shrink": lambda x: x - np.tanh(x),
    "softplus": lambda x: np.log1p(np.exp(x)),
    "softsign": lambda x: x / (1 + np.abs(x)),
    "soft_shrink": lambda x: np.sign(x) * np.maximum(np.abs(x) - 0.5, 0),
    "sparse_plus": lambda x: np.where(
        x <= -1, 0, np.where(x < 1, (x + 1) ** 2 / 4, x)),
    "silu": lambda x: x * _sigmoid(x),
    "squareplus": lambda x: (x + np.sqrt(x * x + 4)) / 2,
    "log_sigmoid": lambda x: np.log(_sigmoid(x)),
    "leaky_relu": lambda x: np.where(x >= 0, x, 0.2 * x),
    "hard_sigmoid": lambda x: np.clip(x / 6 + 0.5, 0, 1),
    "hard_silu": lambda x: x * np.clip(x / 6 + 0.5, 0, 1),
    "elu": lambda x: np.where(x > 0, x, np.exp(x) - 1),
    "selu": lambda x: 1.0507009873554805 * np.where(
        x > 0, x, 1.6732632423543772 * (np.exp(x) - 1)),
    "gelu": lambda x: 0.5 * x * (1 + np.tanh(
        np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3))),
    "celu": lambda x: np.maximum(x, 0) + np.minimum(np.exp(x) - 1, 0),
    "hard_tanh": lambda x: np.clip(x, -1, 1),
    "hard_shrink": lambda x: np.where(np.abs(x) > 0.5, x, 0),
}


@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_activation_values(name):
    x = np.linspace(-4, 4, 33)
    got = getattr(nn, name)(x)
    np.testing.assert_allclose(_np(got), ACTIVATIONS[name](x), rtol=1e-6,
                               atol=1e-7)


def test_activation_extras():
    x = np.linspace(-3, 3, 13)
    from scipy.special import erf

    np.testing.assert_allclose(
        _np(nn.gelu(x, approximate=False)), 0.5 * x * (1 + erf(x / np.sqrt(2))))
    np.testing.assert_allclose(_np(nn.threshold(x, 0.5, -7.0)),
                               np.where(x > 0.5, x, -7.0))
    np.testing.assert_allclose(_np(nn.celu(x, alpha=2.0)),
                               np.maximum(x, 0) + 2 * np.minimum(np.exp(x / 2) - 1, 0))
    y = RNG.standard_normal((2, 6))
    np.testing.assert_allclose(_np(nn.glu(y)), y[:, :3] * _sigmoid(y[:, 3:]))
    with pytest.raises(ValueError, match="even size"):
        nn.glu(np.zeros((2, 5)))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
@pytest.mark.parametrize("name", sorted(ACTIVATIONS) + ["glu", "softmax",
                                                       "log_softmax"])
def test_activations_keep_float_dtype(name, dtype):
    x = core.convert_to_tensor(np.ones((2, 4)), dtype)
    assert getattr(nn, name)(x).dtype == x.dtype


def test_smooth_activations_make_integers_float():
    x = np.arange(-2, 3, dtype=np.int32)
    assert nn.sigmoid(x).dtype == np.float32
    assert nn.relu(x).dtype == np.int32  # piecewise linear keeps integers


@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
def test_softmax_gradient_skips_the_stabilising_max(name):
    # As JAX's: the max subtracted for stability is outside autodiff, so
    # the backward pass has no compare/select chain for it, and the
    # gradient is the analytic one.
    from keras_ipu.device import autodiff
    from keras_ipu.device.ir import ShapedArray
    from keras_ipu.device.trace import trace_flat

    x = RNG.standard_normal((4, 6)).astype("float32")
    w = RNG.standard_normal((4, 6)).astype("float32")

    def loss(v):
        return core.convert_to_tensor(getattr(nn, name)(v) * w).sum()

    graph, _ = trace_flat(lambda v: [autodiff.grad(loss)(v)],
                          [ShapedArray(x.shape, np.dtype("float32"))])
    names = {n.primitive.name for n in graph.nodes}
    assert not names & {"eq", "select_n", "select"}, sorted(names)
    xd, wd = x.astype("float64"), w.astype("float64")
    s = np.exp(xd - xd.max(1, keepdims=True))
    s /= s.sum(1, keepdims=True)
    if name == "softmax":
        want = s * (wd - (s * wd).sum(1, keepdims=True))
    else:
        want = wd - s * wd.sum(1, keepdims=True)
    np.testing.assert_allclose(_np(autodiff.grad(loss)(x)), want, rtol=1e-5, atol=1e-6)


def test_softmax_family():
    x = RNG.standard_normal((3, 4, 5))
    e = np.exp(x - x.max(axis=(0, 2), keepdims=True))
    want = e / e.sum(axis=(0, 2), keepdims=True)
    np.testing.assert_allclose(_np(nn.softmax(x, axis=(0, 2))), want)
    np.testing.assert_allclose(_np(nn.log_softmax(x, axis=1)),
                               x - np.log(np.exp(x).sum(1, keepdims=True)))
    # sparsemax: a projection onto the simplex, exact on a small case.
    z = np.array([[0.1, 1.1, 0.2, 0.8], [3.0, 0.0, -1.0, 0.0]])
    np.testing.assert_allclose(_np(nn.sparsemax(z)),
                               [[0.0, 0.65, 0.0, 0.35], [1, 0, 0, 0]], atol=1e-7)


def test_moments_and_batch_normalization():
    x = RNG.standard_normal((4, 3, 5)).astype(np.float32)
    mean, var = nn.moments(x, axes=(0, 2))
    np.testing.assert_allclose(_np(mean), x.mean((0, 2)), rtol=1e-5)
    np.testing.assert_allclose(_np(var), x.var((0, 2)), rtol=1e-5)
    mean_k, _ = nn.moments(x, axes=[0], keepdims=True)
    assert mean_k.shape == (1, 3, 5)
    big = np.array([60000, -60000, 1000], np.float16)
    _, var16 = nn.moments(big, axes=[0])
    assert var16.dtype == np.float16 and _np(var16) == np.finfo(np.float16).max
    m, v = RNG.random(3), RNG.random(3) + 0.5
    off, sc = RNG.random(3), RNG.random(3)
    got = nn.batch_normalization(x.astype(np.float64), m, v, axis=1,
                                 offset=off, scale=sc, epsilon=1e-3)
    r = (slice(None), None)
    want = (x - m[r]) / np.sqrt(v[r] + 1e-3) * sc[r] + off[r]
    np.testing.assert_allclose(_np(got), want, rtol=1e-6, atol=1e-12)


# --- convolution -----------------------------------------------------------

def naive_conv_nhwc(x, w, stride, pad, dil, groups):
    """x (N, *S, C), Keras kernel (*K, C/groups, O); explicit (lo, hi)
    padding; loops over output pixels and taps."""
    nsp = x.ndim - 2
    x = np.pad(x, [(0, 0)] + list(pad) + [(0, 0)])
    k = w.shape[:nsp]
    cin, cout = w.shape[-2], w.shape[-1]
    span = [(kk - 1) * d + 1 for kk, d in zip(k, dil)]
    out_sp = [(s - sp) // st + 1 for s, sp, st in zip(x.shape[1:-1], span, stride)]
    out = np.zeros([x.shape[0]] + out_sp + [cout])
    og = cout // groups
    for p in itertools.product(*map(range, out_sp)):
        for t in itertools.product(*map(range, k)):
            src = tuple(a * s + b * d for a, s, b, d in zip(p, stride, t, dil))
            for g in range(groups):
                xs = x[(slice(None),) + src + (slice(g * cin, (g + 1) * cin),)]
                ws = w[t + (slice(None), slice(g * og, (g + 1) * og))]
                out[(slice(None),) + p + (slice(g * og, (g + 1) * og),)] += xs @ ws
    return out


def _same_pads(sizes, k, stride, dil):
    pads = []
    for n, kk, s, d in zip(sizes, k, stride, dil):
        span = (kk - 1) * d + 1
        total = max((math.ceil(n / s) - 1) * s + span - n, 0)
        pads.append((total // 2, total - total // 2))
    return pads


@pytest.mark.parametrize(
    "spatial,ksize,stride,dil,groups,padding",
    [
        ((10,), (3,), (2,), (1,), 1, "valid"),
        ((9,), (2,), (1,), (3,), 2, "same"),
        ((7, 8), (3, 3), (2, 1), (1, 1), 1, "same"),
        ((7, 8), (2, 3), (1, 1), (2, 1), 4, "valid"),
        ((5, 4, 6), (2, 2, 3), (1, 2, 1), (1, 1, 1), 2, "same"),
    ],
)
def test_conv_matches_reference(spatial, ksize, stride, dil, groups, padding):
    x = RNG.standard_normal((2,) + spatial + (4,)).astype(np.float32)
    w = RNG.standard_normal(ksize + (4 // groups, 8)).astype(np.float32)
    got = nn.conv(x, w, strides=stride, padding=padding, dilation_rate=dil,
                  data_format="channels_last")
    pads = (_same_pads(spatial, ksize, stride, dil) if padding == "same"
            else [(0, 0)] * len(spatial))
    want = naive_conv_nhwc(x, w, stride, pads, dil, groups)
    np.testing.assert_allclose(_np(got), want, rtol=1e-4, atol=1e-4)
    # channels_first gives the transposed answer.
    perm = (0, x.ndim - 1) + tuple(range(1, x.ndim - 1))
    got_cf = nn.conv(x.transpose(perm), w, strides=stride, padding=padding,
                     dilation_rate=dil, data_format="channels_first")
    np.testing.assert_allclose(_np(got_cf), want.transpose(perm), rtol=1e-4,
                               atol=1e-4)


def test_depthwise_and_separable_conv():
    x = RNG.standard_normal((2, 6, 7, 3))
    dw = RNG.standard_normal((3, 2, 3, 2))  # multiplier 2
    pw = RNG.standard_normal((1, 1, 6, 4))
    got = nn.depthwise_conv(x, dw, strides=1, padding="valid",
                            data_format="channels_last")
    # Depthwise == grouped conv with one group per input channel.
    want = naive_conv_nhwc(x, dw.reshape(3, 2, 1, 6), (1, 1), [(0, 0)] * 2,
                           (1, 1), 3)
    np.testing.assert_allclose(_np(got), want, rtol=1e-10)
    sep = nn.separable_conv(x, dw, pw, padding="valid",
                            data_format="channels_last")
    np.testing.assert_allclose(_np(sep), want @ pw[0, 0], rtol=1e-10)


@pytest.mark.parametrize("padding", ["valid", "same"])
@pytest.mark.parametrize("stride", [1, 2, 3])
def test_conv_transpose_is_the_gradient_of_conv(padding, stride):
    # conv_transpose(y, w) = d<conv(x, w'), y>/dx with w' = w (Keras'
    # (*K, out, in) transpose layout == conv's (*K, in, out) for conv's
    # input x); check the adjoint identity <conv(x), y> == <x, convT(y)>.
    # Sizes where conv_transpose lands exactly back on x's shape (no
    # output_padding): 'valid' needs (n - k) % s == 0, 'same' n % s == 0.
    w = RNG.standard_normal((3, 2, 3, 5))  # conv kernel: in 3, out 5
    if padding == "valid":
        # Keras: valid output = in * s + max(k - s, 0).
        h, wd = 3 + 3 * stride, (2 + 2 * stride if stride <= 2 else 3 * stride)
    else:
        h, wd = 4 * stride, 3 * stride
    x = RNG.standard_normal((1, h, wd, 3))
    y_fwd = _np(nn.conv(x, w, strides=stride, padding=padding,
                        data_format="channels_last"))
    y = RNG.standard_normal(y_fwd.shape)
    back = _np(nn.conv_transpose(y, w, strides=stride, padding=padding,
                                 output_padding=None,
                                 data_format="channels_last"))
    assert back.shape == x.shape
    np.testing.assert_allclose((y_fwd * y).sum(), (x * back).sum(), rtol=1e-9)


def test_conv_transpose_shape_with_output_padding():
    y = np.ones((2, 4, 3), np.float32)
    w = np.ones((2, 5, 3), np.float32)
    out = nn.conv_transpose(y, w, strides=5, padding="valid", output_padding=4,
                            data_format="channels_last")
    assert out.shape == (2, 21, 5)


def test_conv_errors_name_the_problem():
    with pytest.raises(ValueError, match="evenly divisible"):
        nn.conv(np.zeros((1, 5, 5)), np.zeros((3, 2, 4)),
                data_format="channels_last")
    with pytest.raises(ValueError, match="empty output"):
        nn.conv(np.zeros((1, 2, 3)), np.zeros((5, 3, 4)),
                data_format="channels_last")


# --- pooling ---------------------------------------------------------------

def naive_pool(x, window, stride, pads, op):
    """x (N, *S, C) with explicit pads; averages count real cells only."""
    nsp = x.ndim - 2
    valid = np.pad(np.ones(x.shape[1:-1]), pads)
    fill = -np.inf if op == "max" else 0.0
    xp = np.pad(x, [(0, 0)] + list(pads) + [(0, 0)], constant_values=fill)
    out_sp = [(s - k) // st + 1 for s, k, st in zip(xp.shape[1:-1], window, stride)]
    out = np.zeros([x.shape[0]] + out_sp + [x.shape[-1]])
    for p in itertools.product(*map(range, out_sp)):
        idx = tuple(slice(a * s, a * s + k) for a, s, k in zip(p, stride, window))
        block = xp[(slice(None),) + idx + (slice(None),)]
        axes = tuple(range(1, 1 + nsp))
        if op == "max":
            out[(slice(None),) + p] = block.max(axes)
        else:
            out[(slice(None),) + p] = block.sum(axes) / valid[idx].sum()
    return out


@pytest.mark.parametrize("op", ["max", "avg"])
@pytest.mark.parametrize("padding", ["valid", "same"])
@pytest.mark.parametrize(
    "spatial,window,stride",
    [((9,), (3,), (2,)), ((7, 6), (3, 2), (2, 2)), ((5, 4, 5), (2, 2, 3), (1, 2, 2))],
)
def test_pooling_matches_reference(op, padding, spatial, window, stride):
    x = RNG.standard_normal((2,) + spatial + (3,))
    fn = nn.max_pool if op == "max" else nn.average_pool
    got = fn(x, window, stride, padding, data_format="channels_last")
    pads = (_same_pads(spatial, window, stride, (1,) * len(spatial))
            if padding == "same" else [(0, 0)] * len(spatial))
    np.testing.assert_allclose(_np(got), naive_pool(x, window, stride, pads, op),
                               rtol=1e-10)


@pytest.mark.parametrize("op", ["max", "average"])
def test_adaptive_pooling(op):
    x = RNG.standard_normal((2, 3, 7, 5))  # channels_first
    fn = nn.adaptive_max_pool if op == "max" else nn.adaptive_average_pool
    got = _np(fn(x, (3, 4), data_format="channels_first"))
    want = np.zeros((2, 3, 3, 4))
    for i in range(3):
        h0, h1 = (i * 7) // 3, -(-(i + 1) * 7 // 3)
        for j in range(4):
            w0, w1 = (j * 5) // 4, -(-(j + 1) * 5 // 4)
            block = x[:, :, h0:h1, w0:w1]
            want[:, :, i, j] = (block.max((2, 3)) if op == "max"
                                else block.mean((2, 3)))
    np.testing.assert_allclose(got, want, rtol=1e-10)


# --- encodings and losses ----------------------------------------------------

def test_one_hot_and_multi_hot():
    x = np.array([[0, 3], [-1, 2]])
    got = nn.one_hot(x, 4, axis=1, dtype="int32")
    want = np.zeros((2, 4, 2), np.int32)
    want[0, 0, 0] = want[0, 3, 1] = want[1, 2, 1] = 1
    np.testing.assert_array_equal(_np(got), want)
    assert got.dtype == np.int32
    np.testing.assert_array_equal(_np(nn.multi_hot(x, 4)),
                                  [[1, 0, 0, 1], [0, 0, 1, 0]])
    assert nn.multi_hot(x, 4, dtype="bool").dtype == np.bool_


def test_crossentropies():
    t = RNG.random((4, 3))
    o = RNG.random((4, 3)) + 0.1
    p = np.clip(o / o.sum(-1, keepdims=True), 1e-7, 1 - 1e-7)
    np.testing.assert_allclose(_np(nn.categorical_crossentropy(t, o)),
                               -(t * np.log(p)).sum(-1))
    logits = RNG.standard_normal((4, 3))
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    np.testing.assert_allclose(
        _np(nn.categorical_crossentropy(t, logits, from_logits=True)),
        -(t * logp).sum(-1))
    labels = np.array([2, 0, 1, 1])
    np.testing.assert_allclose(
        _np(nn.sparse_categorical_crossentropy(labels, logits, from_logits=True)),
        -logp[np.arange(4), labels])
    np.testing.assert_allclose(
        _np(nn.sparse_categorical_crossentropy(labels[:, None], o)),
        -np.log(p[np.arange(4), labels]))
    tb = RNG.random((5,))
    ob = np.clip(RNG.random((5,)), 1e-7, 1 - 1e-7)
    np.testing.assert_allclose(
        _np(nn.binary_crossentropy(tb, ob)),
        -(tb * np.log(ob) + (1 - tb) * np.log(1 - ob)))
    np.testing.assert_allclose(
        _np(nn.binary_crossentropy(tb, logits[:, 0].repeat(2)[:5],
                                   from_logits=True)),
        -(tb * np.log(_sigmoid(logits[:, 0].repeat(2)[:5]))
          + (1 - tb) * np.log(1 - _sigmoid(logits[:, 0].repeat(2)[:5]))))


def test_psnr():
    a, b = RNG.random((4, 4)), RNG.random((4, 4))
    mse = ((a - b) ** 2).mean()
    np.testing.assert_allclose(_np(nn.psnr(a, b, 1.0)), -10 * np.log10(mse))


# --- CTC: brute force over all alignments ------------------------------------

def _collapse(path, blank):
    out = []
    prev = None
    for c in path:
        if c != prev and c != blank:
            out.append(c)
        prev = c
    return tuple(out)


def _label_probs(probs, blank):
    """{label sequence: total probability} over all alignments."""
    totals = {}
    steps, classes = probs.shape
    for path in itertools.product(range(classes), repeat=steps):
        p = np.prod([probs[t, c] for t, c in enumerate(path)])
        key = _collapse(path, blank)
        totals[key] = totals.get(key, 0.0) + p
    return totals


def _softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def test_ctc_loss_matches_brute_force():
    logits = RNG.standard_normal((3, 5, 4))
    labels = np.array([[1, 2, 0], [3, 3, 0], [2, 1, 2]])
    label_len = np.array([2, 2, 3])
    out_len = np.array([5, 4, 5])
    got = _np(nn.ctc_loss(labels, logits, label_len, out_len, mask_index=0))
    for b in range(3):
        totals = _label_probs(_softmax(logits[b, : out_len[b]]), blank=0)
        want = -np.log(totals[tuple(labels[b, : label_len[b]])])
        np.testing.assert_allclose(got[b], want, rtol=1e-6)


def test_ctc_decode_greedy():
    x = np.log(np.array([[[0.1, 0.6, 0.3], [0.1, 0.7, 0.2], [0.8, 0.1, 0.1],
                          [0.2, 0.2, 0.6], [0.1, 0.1, 0.8]]]))
    (decoded,), scores = nn.ctc_decode(x, [5], strategy="greedy")
    np.testing.assert_array_equal(_np(decoded), [[1, 2, -1, -1, -1]])
    np.testing.assert_allclose(_np(scores), [[-x[0].max(-1).sum()]])
    (kept,), _ = nn.ctc_decode(x, [5], strategy="greedy", merge_repeated=False)
    np.testing.assert_array_equal(_np(kept), [[1, 1, 2, 2, -1]])
    (short,), _ = nn.ctc_decode(x, [2], strategy="greedy")
    np.testing.assert_array_equal(_np(short), [[1, -1, -1, -1, -1]])


def test_ctc_beam_search_is_exact_with_a_wide_beam():
    logits = RNG.standard_normal((2, 4, 3))
    paths, scores = nn.ctc_decode(logits, [4, 3], strategy="beam_search",
                                  beam_width=64, top_paths=3, mask_index=0)
    assert paths.shape == (3, 2, 4) and scores.shape == (2, 3)
    for b, length in enumerate([4, 3]):
        totals = _label_probs(_softmax(logits[b, :length]), blank=0)
        best = sorted(totals.items(), key=lambda kv: -kv[1])[:3]
        for k, (seq, prob) in enumerate(best):
            np.testing.assert_allclose(_np(scores)[b, k], np.log(prob), rtol=1e-6)
            row = _np(paths)[k, b]
            assert tuple(row[row >= 0]) == seq
            assert (row[len(seq):] == -1).all()


# --- attention, patches, pixel shuffles ---------------------------------------

def test_dot_product_attention_grouped_heads_and_masks():
    q = RNG.standard_normal((2, 3, 4, 5))
    k = RNG.standard_normal((2, 6, 2, 5))
    v = RNG.standard_normal((2, 6, 2, 7))
    mask = RNG.random((2, 4, 3, 6)) > 0.3
    mask[..., 0] = True
    bias = RNG.standard_normal((2, 4, 3, 6))
    got = _np(nn.dot_product_attention(q, k, v, bias=bias, mask=mask, scale=0.3))
    kk = np.repeat(k, 2, axis=2)
    vv = np.repeat(v, 2, axis=2)
    logits = np.einsum("btnh,bsnh->bnts", q, kk) * 0.3 + bias
    logits = np.where(mask, logits, -np.inf)
    want = np.einsum("bnts,bsnh->btnh", _softmax(logits), vv)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    causal = _np(nn.dot_product_attention(q, k[:, :3], v[:, :3], is_causal=True))
    logits = np.einsum("btnh,bsnh->bnts", q, kk[:, :3]) / np.sqrt(5)
    logits = np.where(np.tril(np.ones((3, 3), bool)), logits, -np.inf)
    want = np.einsum("bnts,bsnh->btnh", _softmax(logits), vv[:, :3])
    np.testing.assert_allclose(causal, want, rtol=1e-6)


def naive_unfold(x, k, d, p, s):
    n, c, h, w = x.shape
    xp = np.pad(x, ((0, 0), (0, 0), (p[0], p[0]), (p[1], p[1])))
    oh = (h + 2 * p[0] - (k[0] - 1) * d[0] - 1) // s[0] + 1
    ow = (w + 2 * p[1] - (k[1] - 1) * d[1] - 1) // s[1] + 1
    out = np.zeros((n, c, k[0], k[1], oh, ow))
    for i, j, a, b in itertools.product(range(k[0]), range(k[1]), range(oh), range(ow)):
        out[:, :, i, j, a, b] = xp[:, :, a * s[0] + i * d[0], b * s[1] + j * d[1]]
    return out.reshape(n, c * k[0] * k[1], oh * ow)


@pytest.mark.parametrize("k,d,p,s", [((2, 2), (1, 1), (0, 0), (1, 1)),
                                     ((3, 2), (2, 1), (1, 2), (2, 3))])
def test_unfold_and_fold(k, d, p, s):
    x = RNG.standard_normal((2, 3, 9, 8))
    cols = _np(nn.unfold(x, k, d, p, s))
    np.testing.assert_allclose(cols, naive_unfold(x, k, d, p, s), rtol=1e-12)
    # fold is unfold's adjoint: <unfold(x), y> == <x, fold(y)>.
    y = RNG.standard_normal(cols.shape)
    back = _np(nn.fold(y, (9, 8), k, d, p, s))
    assert back.shape == x.shape
    np.testing.assert_allclose((cols * y).sum(), (x * back).sum(), rtol=1e-10)


def test_unfold_is_exact_for_non_finite_pixels():
    x = np.arange(16.0).reshape(1, 1, 4, 4)
    x[0, 0, 1, 2] = np.inf
    cols = _np(nn.unfold(x, 2))
    np.testing.assert_array_equal(cols, naive_unfold(x, (2, 2), (1, 1), (0, 0), (1, 1)))
    assert not np.isnan(cols).any()


def test_depth_to_space_and_back():
    x = RNG.standard_normal((2, 3, 4, 8))
    up = _np(nn.depth_to_space(x, 2, "channels_last"))
    assert up.shape == (2, 6, 8, 2)
    np.testing.assert_array_equal(up[0, 1, 3], x[0, 0, 1].reshape(2, 2, 2)[1, 1])
    np.testing.assert_array_equal(_np(nn.space_to_depth(up, 2, "channels_last")), x)
    xf = x.transpose(0, 3, 1, 2)
    upf = _np(nn.depth_to_space(xf, 2, "channels_first"))
    np.testing.assert_array_equal(
        _np(nn.space_to_depth(upf, 2, "channels_first")), xf)
    with pytest.raises(ValueError, match="at least 2"):
        nn.depth_to_space(x, 1)


# --- tracing: every op with an unknown batch size ----------------------------

def _spec(shape, dtype="float32"):
    return KerasTensor(shape, dtype=dtype)


TRACED = [
    ("relu", lambda x: nn.relu(x), (None, 4)),
    ("gelu", lambda x: nn.gelu(x, False), (None, 4)),
    ("glu", lambda x: nn.glu(x), (None, 4)),
    ("softmax", lambda x: nn.softmax(x, axis=(0, 1)), (None, 4)),
    ("sparsemax", lambda x: nn.sparsemax(x), (None, 4)),
    ("moments", lambda x: nn.moments(x, [0])[1], (None, 4)),
    ("conv", lambda x: nn.conv(x, np.ones((3, 3, 3, 2), "float32"), 2, "same",
                               "channels_last"), (None, 8, 8, 3)),
    ("depthwise", lambda x: nn.depthwise_conv(
        x, np.ones((3, 3, 3, 2), "float32"), 1, "valid", "channels_last"),
     (None, 8, 8, 3)),
    ("conv_transpose", lambda x: nn.conv_transpose(
        x, np.ones((3, 3, 2, 3), "float32"), 2, "same", None, "channels_last"),
     (None, 8, 8, 3)),
    ("max_pool", lambda x: nn.max_pool(x, 2, 2, "same", "channels_last"),
     (None, 7, 8, 3)),
    ("average_pool", lambda x: nn.average_pool(x, 3, 2, "same", "channels_last"),
     (None, 7, 8, 3)),
    ("adaptive", lambda x: nn.adaptive_average_pool(x, (3, 2), "channels_last"),
     (None, 7, 8, 3)),
    ("categorical_crossentropy",
     lambda x: nn.categorical_crossentropy(x, x), (None, 4)),
    ("binary_crossentropy", lambda x: nn.binary_crossentropy(x, x), (None, 4)),
    ("attention", lambda x: nn.dot_product_attention(x, x, x, is_causal=True),
     (None, 3, 2, 4)),
    ("unfold", lambda x: nn.unfold(x, 2), (None, 3, 5, 5)),
    ("depth_to_space", lambda x: nn.depth_to_space(x, 2), (None, 3, 5, 8)),
    ("space_to_depth", lambda x: nn.space_to_depth(x, 2), (None, 4, 6, 3)),
    ("ctc_loss", lambda x: nn.ctc_loss(np.ones((2, 2), "int32"), x,
                                       np.array([2, 2]), np.array([3, 3])),
     (2, 3, 4)),
    ("ctc_greedy", lambda x: nn.ctc_decode(x, np.array([3, 3]))[0], (2, 3, 4)),
    ("ctc_beam", lambda x: nn.ctc_decode(x, np.array([3, 3]), "beam_search",
                                         beam_width=4, top_paths=2)[1], (2, 3, 4)),
]


@pytest.mark.parametrize("name,fn,shape", TRACED, ids=[t[0] for t in TRACED])
def test_traced_shapes_agree_with_eager(name, fn, shape):
    spec = core.compute_output_spec(fn, _spec(shape))
    concrete = tuple(2 if d is None else d for d in shape)
    x = RNG.random(concrete).astype(np.float32) + 0.1
    out = fn(x)
    assert spec.dtype == str(out.dtype)
    assert len(spec.shape) == len(out.shape)
    for s, o in zip(spec.shape, out.shape):
        assert s is None or s == o
    if shape[0] is None and name not in ("moments", "softmax"):
        assert spec.shape[0] is None  # the batch stays unknown


def test_ctc_beam_search_primitive_shape_rule():
    from keras_ipu.device.ir import ShapedArray
    from keras_ipu.device.primitives.ctc import ctc_beam_search_p
    from keras_ipu.device.trace import GraphBuilder

    lp = np.log(_softmax(RNG.standard_normal((3, 5, 4)))).astype(np.float32)
    lengths = np.array([5, 2, 0], np.int32)
    params = dict(beam_width=3, top_paths=2, mask_index=0)
    paths, scores = ctc_beam_search_p.bind(lp, lengths, **params)
    rule = ctc_beam_search_p.shape_rule(
        ShapedArray(lp.shape, lp.dtype), ShapedArray(lengths.shape, np.int32),
        **params)
    assert rule == (ShapedArray(paths.shape, paths.dtype),
                    ShapedArray(scores.shape, scores.dtype))
    # A zero-length sequence decodes to the empty path with certainty.
    np.testing.assert_array_equal(_np(paths)[0, 2], -1)
    assert _np(scores)[2, 0] == 0.0
    builder = GraphBuilder()
    tx = builder.new_input(ShapedArray((None, 5, 4), np.float32))
    tl = builder.new_input(ShapedArray((None,), np.int32))
    tp, ts = ctc_beam_search_p.bind(tx, tl, **params)
    assert tp.shape == (2, None, 5) and ts.shape == (None, 2)
    with pytest.raises(ValueError, match="top_paths=4 is larger"):
        nn.ctc_decode(lp, lengths, "beam_search", beam_width=3, top_paths=4)
