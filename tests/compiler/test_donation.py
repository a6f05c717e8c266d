"""Donation (donation.py): which buffers a program may overwrite, jit's
donate_argnums, and scans updating their carries in place."""

import pytest
import numpy as np
from compiler_graphs import aval
from compiler_graphs import build
from compiler_graphs import lit
from keras import ops

from keras_ipu.backend.control_flow import scan
from keras_ipu.device.compiler import ExecutableCache
from keras_ipu.device.compiler.donation import donatable_operands
from keras_ipu.device.compiler.fusion import fuse_elementwise
from keras_ipu.device.jit import jit

_MATMUL = (((1,), (0,)), ((), ()))


def _update_graph(reshape_weights=False):
    # w' = 0.99 w - sum(2 lr x w): the weights are read by a product first.
    def body(b, w, x, lr):
        seen = b.op("reshape", w, new_shape=(12,)) if reshape_weights else w
        y = b.op("dot_general", x, w, dimension_numbers=_MATMUL)
        step = b.op("mul", b.op("mul", y, lr), lit(2.0, "float32"))
        decayed = b.op("mul", w, lit(0.99, "float32"))
        outs = [b.op("sub", decayed, b.op("reduce_sum", step, axes=(0,)))]
        return outs + ([seen] if reshape_weights else [])

    return build([aval((4, 3)), aval((5, 4)), aval(())], body)


def _overwritten(graph, donated):
    """The graph inputs some fused chain may write into."""
    fused = fuse_elementwise(graph, donated)
    written = set()
    for node in fused.nodes:
        for k in node.params.get("donate", ()):
            if node.inputs[k] in fused.inputs:
                written.add(fused.inputs.index(node.inputs[k]))
    return written


def test_donated_input_is_written_by_its_last_reader_only():
    graph = _update_graph()
    # The weights (input 0) are read by the product, then by the update:
    # the update may overwrite them once donated, never otherwise.
    assert _overwritten(graph, (0,)) == {0}
    assert _overwritten(graph, ()) == set()


def test_no_donation_past_a_view_or_into_an_output():
    # A reshape of the weights is a view that is returned: overwriting the
    # weights would change it.
    graph = _update_graph(reshape_weights=True)
    assert _overwritten(graph, (0,)) == set()

    def body(b, w):
        return [b.op("mul", b.op("add", w, w), w), w]  # w is returned

    g = build([aval((4, 3))], body)
    donate = donatable_operands(g, (0,))
    w = g.inputs[0]
    assert donate == {1: (0,)}  # the sum w + w, a fresh array; never w
    assert all(g.nodes[i].inputs[k] is not w for i, ks in donate.items() for k in ks)


@pytest.mark.numpy_engine
def test_jit_donate_argnums_updates_in_place_and_keeps_other_arguments():
    def sgd(state, grad):
        w, m = state
        new_m = m * 0.9 - grad * 0.1
        return (w + new_m, new_m)

    rng = np.random.default_rng(0)
    w, m, g = (rng.standard_normal((64, 32)).astype(np.float32) for _ in range(3))
    want_m = m * np.float32(0.9) - g * np.float32(0.1)
    want_w = w + want_m
    g_before = g.copy()
    fast = jit(sgd, cache=ExecutableCache(), donate_argnums=(0,))
    w_in, m_in = w.copy(), m.copy()
    new_w, new_m = fast((w_in, m_in), g)
    np.testing.assert_allclose(new_m, want_m, rtol=1e-6)
    np.testing.assert_allclose(new_w, want_w, rtol=1e-6)
    # The state was updated in place; the gradient (not donated) is intact.
    assert np.shares_memory(new_m, m_in) or np.shares_memory(new_w, w_in)
    np.testing.assert_array_equal(g, g_before)
    plain = jit(sgd, cache=ExecutableCache())
    w_in, m_in = w.copy(), m.copy()
    plain((w_in, m_in), g)
    np.testing.assert_array_equal(w_in, w)  # without donation: untouched
    np.testing.assert_array_equal(m_in, m)


def test_scan_updates_carries_in_place_but_never_an_undonated_initial_carry():
    def loop(state, xs):
        def body(carry, x):
            acc, scale = carry
            acc = acc * 0.5 + x * scale
            return (acc, scale), ops.sum(acc)

        return scan(body, state, xs)

    rng = np.random.default_rng(1)
    acc = rng.standard_normal((16, 16)).astype(np.float32)
    scale = np.asarray(2.0, np.float32)
    xs = rng.standard_normal((5, 16, 16)).astype(np.float32)
    want = acc.copy()
    sums = []
    for x in xs:
        want = want * np.float32(0.5) + x * scale
        sums.append(want.sum())
    for donate in ((), (0,)):
        acc_in, xs_in = acc.copy(), xs.copy()
        fast = jit(loop, cache=ExecutableCache(), donate_argnums=donate)
        (new_acc, _), ys = fast((acc_in, scale), xs_in)
        np.testing.assert_allclose(new_acc, want, rtol=1e-5)
        np.testing.assert_allclose(ys, sums, rtol=1e-5)
        np.testing.assert_array_equal(xs_in, xs)  # the stacked inputs never change
        if not donate:
            np.testing.assert_array_equal(acc_in, acc)  # copied before the loop
        else:
            # The scan declares carries_in_place: the donated carry's buffer
            # is the one the loop updates (not copied first).
            assert np.shares_memory(np.asarray(new_acc), acc_in)
