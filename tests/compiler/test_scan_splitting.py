"""Scan splitting (compiler/scan_splitting.py): the products of a scan body
that need no other step's result run outside the loop, with the values of
the loop they replace."""

import keras
import numpy as np
import pytest

from keras_ipu.device import autodiff
from keras_ipu.device.compiler import CompileOptions
from keras_ipu.device.jit import jit

NOT_SPLIT = CompileOptions(split_scans=False)


def _rng_arrays(*shapes, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s).astype(np.float32) for s in shapes]


def _scans(graph):
    return [n for n in graph.nodes if n.primitive.name == "scan"]


def _count(graph, name):
    return sum(n.primitive.name == name for n in graph.nodes)


def _recurrence(reverse):
    """Each kind of product the pass moves, beside one it must keep: h @ u
    needs the previous step."""

    def fn(w, u, v, xs, h0, acc0, bias0):
        def step(carry, x):
            h, acc, bias = carry
            z = keras.ops.matmul(x, w)  # hoisted: an xs slice times a constant
            h = keras.ops.tanh(z + keras.ops.matmul(h, u))
            acc = acc + keras.ops.matmul(keras.ops.transpose(x), h)  # accumulated
            bias = keras.ops.sum(h, axis=0) + bias  # accumulated, operands swapped
            y = keras.ops.matmul(h, v)  # a stacked output: sunk
            return (h, acc, bias), y

        (h, acc, bias), ys = keras.ops.scan(step, (h0, acc0, bias0), xs, reverse=reverse)
        return h, acc, bias, ys

    return fn


@pytest.mark.parametrize("reverse", [False, True])
def test_split_products_give_the_loops_values(reverse):
    t, b, f, hdim, o = 6, 5, 8, 4, 16
    w, u, v, xs, h0, acc0, bias0 = _rng_arrays(
        (f, hdim), (hdim, hdim), (hdim, o), (t, b, f), (b, hdim), (f, hdim), (hdim,))
    fn = _recurrence(reverse)
    split = jit(fn)
    args = (w, u, v, xs, h0, acc0, bias0)
    got = split(*args)
    want = jit(fn, options=NOT_SPLIT)(*args)
    for a, e in zip(got, want):
        np.testing.assert_allclose(a, e, rtol=1e-5, atol=1e-6)

    graph = split.executable(*args).graph
    (scan,) = _scans(graph)
    body = scan.params["body"]
    # Only h @ u stays in the loop; the carries left are h (acc and bias
    # are sums after the loop).
    assert _count(body, "dot_general") == 1
    assert scan.params["n_carry"] == 1
    assert _count(graph, "dot_general") == 3  # x w before; x^T h and h v after
    (plain,) = _scans(jit(fn, options=NOT_SPLIT).executable(*args).graph)
    assert _count(plain.params["body"], "dot_general") == 4
    assert plain.params["n_carry"] == 3


def test_a_carry_the_body_reads_stays_a_carry():
    """acc feeds its own update (acc @ m): not a sum of per-step terms."""

    def fn(m, xs, acc0):
        def step(acc, x):
            return acc + keras.ops.matmul(acc, m) * x, keras.ops.matmul(x, m)

        return keras.ops.scan(step, acc0, xs)

    m, xs, acc0 = _rng_arrays((3, 3), (4, 2, 3), (2, 3), seed=1)
    split = jit(fn)
    got = split(m, xs, acc0)
    want = jit(fn, options=NOT_SPLIT)(m, xs, acc0)
    for a, e in zip(got, want):
        np.testing.assert_allclose(a, e, rtol=1e-5, atol=1e-6)
    (scan,) = _scans(split.executable(m, xs, acc0).graph)
    assert scan.params["n_carry"] == 1
    # The stacked x @ m went before the loop; acc @ m stays.
    assert _count(scan.params["body"], "dot_general") == 1


def test_an_lstm_training_step_splits_and_keeps_its_gradients():
    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((7, 5)), keras.layers.LSTM(6),
                              keras.layers.Dense(2)])
    weights = [np.asarray(w.value) for w in model.trainable_variables]
    fixed = [np.asarray(w.value) for w in model.non_trainable_variables]
    x, y = _rng_arrays((4, 7, 5), (4, 2), seed=2)

    def loss_of(trainable, x, y):
        pred, _ = model.stateless_call(trainable, fixed, x)
        return keras.ops.mean(keras.ops.square(pred - y))

    grad = autodiff.value_and_grad(loss_of)
    split = jit(grad)
    loss, grads = split(weights, x, y)
    want_loss, want_grads = jit(grad, options=NOT_SPLIT)(weights, x, y)
    np.testing.assert_allclose(loss, want_loss, rtol=1e-6)
    for a, e in zip(grads, want_grads):
        np.testing.assert_allclose(a, e, rtol=1e-5, atol=1e-7)

    scans = _scans(split.executable(weights, x, y).graph)
    plain = _scans(jit(grad, options=NOT_SPLIT).executable(weights, x, y).graph)
    assert len(scans) == len(plain) == 2
    # Only the recurrent products stay: h_{t-1} U forward, dz_t U^T back;
    # x_t W and the two weight gradients run outside (x is an input: no
    # input gradient).
    in_loop = [_count(s.params["body"], "dot_general") for s in scans]
    assert in_loop == [1, 1]
    assert [_count(s.params["body"], "dot_general") for s in plain] == [2, 3]


def test_no_split_that_would_stack_more_than_the_loop_already_does():
    """sum_t x_t^T g_t with a wide g: stacking every g_t would hold 16x the
    bytes of the xs the loop reads; the accumulator stays."""

    def fn(m, xs, acc0):
        def step(acc, x):
            g = keras.ops.tanh(keras.ops.matmul(keras.ops.sin(x), m))
            return acc + keras.ops.matmul(keras.ops.transpose(x), g), None

        acc, _ = keras.ops.scan(step, acc0, xs)
        return acc

    m, xs, acc0 = _rng_arrays((4, 64), (5, 2, 4), (4, 64), seed=4)
    split = jit(fn)
    np.testing.assert_allclose(split(m, xs, acc0), jit(fn, options=NOT_SPLIT)(m, xs, acc0),
                               rtol=1e-6)
    (scan,) = _scans(split.executable(m, xs, acc0).graph)
    assert scan.params["n_carry"] == 1
    assert _count(scan.params["body"], "dot_general") == 2


@pytest.mark.parametrize("reverse", [False, True])
def test_the_last_step_of_a_stacked_carry_is_the_final_carry(reverse):
    """Keras' RNN stacks h and takes outputs[-1]: the final carry, unstacked."""

    def fn(u, xs, h0):
        def step(h, x):
            h = keras.ops.tanh(x + keras.ops.matmul(h, u))
            return h, h

        h, hs = keras.ops.scan(step, h0, xs, reverse=reverse)
        return h, hs[0] if reverse else hs[-1]

    u, xs, h0 = _rng_arrays((3, 3), (5, 2, 3), (2, 3), seed=5)
    split = jit(fn)
    got = split(u, xs, h0)
    want = jit(fn, options=NOT_SPLIT)(u, xs, h0)
    for a, e in zip(got, want):
        np.testing.assert_array_equal(a, e)
    (scan,) = _scans(split.executable(u, xs, h0).graph)
    assert len(scan.outputs) == scan.params["n_carry"] == 1
    (plain,) = _scans(jit(fn, options=NOT_SPLIT).executable(u, xs, h0).graph)
    assert len(plain.outputs) == 2


def test_a_stack_read_at_other_steps_stays():
    def fn(u, xs, h0):
        def step(h, x):
            h = keras.ops.tanh(x + keras.ops.matmul(h, u))
            return h, h

        h, hs = keras.ops.scan(step, h0, xs)
        return hs[-1] + hs[1]

    u, xs, h0 = _rng_arrays((3, 3), (5, 2, 3), (2, 3), seed=6)
    split = jit(fn)
    np.testing.assert_array_equal(split(u, xs, h0), jit(fn, options=NOT_SPLIT)(u, xs, h0))
    (scan,) = _scans(split.executable(u, xs, h0).graph)
    assert len(scan.outputs) == 2


def test_scans_nested_in_a_loop_body_are_split_in_the_program_graph():
    """The graph runtime and XLA emit the program's graph, bodies included
    (the device loop holds the training step's scans)."""

    def fn(w, xss, h0):
        def outer(h, xs):
            def step(h, x):
                h = keras.ops.tanh(keras.ops.matmul(x, w) + h)
                return h, None

            h, _ = keras.ops.scan(step, h, xs)
            return h, None

        h, _ = keras.ops.scan(outer, h0, xss)
        return h

    w, xss, h0 = _rng_arrays((6, 4), (2, 5, 2, 6), (2, 4), seed=7)
    split = jit(fn)
    np.testing.assert_allclose(split(w, xss, h0), jit(fn, options=NOT_SPLIT)(w, xss, h0),
                               rtol=1e-6)
    graph = split.executable(w, xss, h0).graph
    (loop,) = _scans(graph)
    (inner,) = _scans(loop.params["body"])
    # x W left the inner loop, then the outer one: one product over all
    # steps of both.
    assert _count(inner.params["body"], "dot_general") == 0
    assert _count(loop.params["body"], "dot_general") == 0
    assert _count(graph, "dot_general") == 1
