"""backend.rnn against a NumPy reference loop: plain, masked, backwards,
unrolled, with constants, and traced with an unknown batch size."""

import importlib

import numpy as np
import pytest

from keras import ops
from keras.src import tree

from keras_ipu.backend.rnn import rnn
from keras_ipu.device.interpreter import eval_graph
from keras_ipu.device.ir import ShapedArray
from keras_ipu.device.trace import trace_flat

# `keras_ipu.backend.rnn` the attribute is the function; this is the module.
rnn_mod = importlib.import_module("keras_ipu.backend.rnn")
RNG = np.random.default_rng(1)
B, T, D, H = 3, 5, 4, 2
W = RNG.normal(size=(D, H)).astype("float32")
U = RNG.normal(size=(H, H)).astype("float32")


def step(x_t, states):
    h = ops.tanh(ops.matmul(x_t, W) + ops.matmul(states[0], U))
    return h, [h]


def reference(x, h0, mask=None, go_backwards=False, zero_output_for_mask=False):
    """Keras' rnn semantics, written out with NumPy."""
    h = h0
    outs = np.zeros((B, T, H), "float32")
    prev_out = np.zeros((B, H), "float32")
    order = range(T - 1, -1, -1) if go_backwards else range(T)
    for k, t in enumerate(order):
        new = np.tanh(x[:, t] @ W + h @ U)
        if mask is not None:
            keep = mask[:, t][:, None]
            held = np.zeros_like(new) if zero_output_for_mask else h
            out = np.where(keep, new, held)
            h = np.where(keep, new, h)
        else:
            out = h = new
        # Outputs are in the order the steps ran (reversed for backwards).
        outs[:, k] = out
        prev_out = out
    return prev_out, outs, h


def _inputs():
    x = RNG.normal(size=(B, T, D)).astype("float32")
    h0 = RNG.normal(size=(B, H)).astype("float32")
    return x, h0


@pytest.mark.parametrize("go_backwards", [False, True])
@pytest.mark.parametrize("unroll", [False, True])
def test_rnn_matches_reference(go_backwards, unroll):
    x, h0 = _inputs()
    last, outs, states = rnn(step, x, [h0], go_backwards=go_backwards, unroll=unroll)
    ref_last, ref_outs, ref_h = reference(x, h0, go_backwards=go_backwards)
    np.testing.assert_allclose(last, ref_last, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(outs, ref_outs, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(states[0], ref_h, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("zero_output_for_mask", [False, True])
def test_rnn_with_mask_matches_reference(zero_output_for_mask):
    x, h0 = _inputs()
    mask = RNG.random((B, T)) > 0.4
    mask[:, 0] = True
    last, outs, states = rnn(step, x, [h0], mask=mask,
                             zero_output_for_mask=zero_output_for_mask)
    ref_last, ref_outs, ref_h = reference(
        x, h0, mask=mask, zero_output_for_mask=zero_output_for_mask
    )
    np.testing.assert_allclose(outs, ref_outs, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(last, ref_last, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(states[0], ref_h, rtol=1e-5, atol=1e-6)


def test_rnn_unrolled_mask_matches_scan_path_when_first_step_is_kept():
    x, h0 = _inputs()
    mask = RNG.random((B, T)) > 0.4
    mask[:, 0] = True
    a = rnn(step, x, [h0], mask=mask, unroll=False)
    b = rnn(step, x, [h0], mask=mask, unroll=True)
    for u, v in zip(tree.flatten(a), tree.flatten(b)):
        np.testing.assert_allclose(u, v, rtol=1e-5, atol=1e-6)


def test_rnn_constants_time_major_and_last_output_only():
    x, h0 = _inputs()
    bias = np.float32(0.5)

    def step_c(x_t, states):
        h_prev, c = states
        h = ops.tanh(ops.matmul(x_t, W) + ops.matmul(h_prev, U) + c)
        return h, [h]

    x_tm = np.transpose(x, (1, 0, 2))
    last, outs, _ = rnn(step_c, x_tm, [h0], constants=[bias], time_major=True,
                        unroll=True, return_all_outputs=False)
    h = h0
    for t in range(T):
        h = np.tanh(x[:, t] @ W + h @ U + bias)
    np.testing.assert_allclose(last, h, rtol=1e-5, atol=1e-6)
    assert tuple(outs.shape) == (1, B, H)


def test_rnn_traced_with_unknown_batch_is_one_scan():
    x, h0 = _inputs()
    mask = RNG.random((B, T)) > 0.3
    mask[:, 0] = True
    box = {}

    def fn(x, h0, mask):
        out = rnn(step, x, [h0], mask=mask)
        box["tree"] = out
        return tree.flatten(out)

    avals = [ShapedArray((None, T, D), np.float32), ShapedArray((None, H), np.float32),
             ShapedArray((None, T), np.bool_)]
    graph, captures = trace_flat(fn, avals)
    assert [n.primitive.name for n in graph.nodes].count("scan") == 1
    assert [v.aval.shape for v in graph.outputs] == [(None, H), (None, T, H), (None, H)]
    got = [np.asarray(v) for v in eval_graph(graph, x, h0, mask)]
    ref_last, ref_outs, ref_h = reference(x, h0, mask=mask)
    np.testing.assert_allclose(got[0], ref_last, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got[1], ref_outs, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got[2], ref_h, rtol=1e-5, atol=1e-6)


def test_unroll_needs_a_static_time_axis():
    def fn(x, h0):
        return tree.flatten(rnn(step, x, [h0], unroll=True))

    with pytest.raises(ValueError, match="fixed number of timesteps"):
        trace_flat(fn, [ShapedArray((B, None, D), np.float32),
                        ShapedArray((B, H), np.float32)])


def test_fused_kernels_defer_to_the_generic_path():
    assert rnn_mod.cudnn_ok("tanh", "sigmoid", False) is False
    for fn in (rnn_mod.lstm, rnn_mod.gru, rnn_mod.bidirectional_lstm,
               rnn_mod.bidirectional_gru):
        with pytest.raises(NotImplementedError):
            fn()
