"""XLA's select-and-scatter through the front end: TensorFlow's max-pool
gradient (a GE select) becomes the device's one select_and_scatter_add;
any other select is applied tap by tap. Both give XLA's numbers exactly,
ties and windows of -inf beside padding included."""

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from tensorflow.compiler.tf2xla.python import xla  # noqa: E402

from keras_ipu.frontends.tensorflow.function import BridgedFunction  # noqa: E402

rng = np.random.default_rng(3)
# Small integers: many ties inside each window.
TIES = rng.integers(0, 3, size=(2, 7, 7, 2)).astype(np.float32)
# A corner of -inf under SAME padding: padding must not take its gradient.
NEG = TIES.copy()
NEG[:, :3, :3, :] = -np.inf


def _pool_grad(ksize, strides, padding):
    def fn(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = tf.nn.max_pool2d(x, ksize, strides, padding)
        # Distinct cotangents, so a wrong pick shows in the values.
        g = tf.reshape(tf.range(tf.size(y), dtype=tf.float32), tf.shape(y)) + 1
        return tape.gradient(y, x, output_gradients=g)
    return fn


def _primitives(bridged, x):
    _, _, _, program = bridged.program((x,))
    return [n.primitive.name for n in program.graph.nodes]


@pytest.mark.parametrize("data", ["ties", "neg_inf"])
@pytest.mark.parametrize("window", [(3, 2, "SAME"), (2, 2, "VALID"), (3, 1, "SAME")])
def test_max_pool_gradient_is_one_primitive_with_xla_numbers(data, window):
    x = tf.constant(TIES if data == "ties" else NEG)
    fn = _pool_grad(*window)
    want = tf.function(fn, jit_compile=True, autograph=False)(x)
    bridged = BridgedFunction(tf.function(fn, jit_compile=True, autograph=False))
    got = bridged(x)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    names = _primitives(bridged, x)
    assert names.count("select_and_scatter_add") == 1
    # No per-tap masks and pads are left (the tap-by-tap path pads each share).
    assert "pad" not in names and "select" not in names


def _select_and_scatter(select):
    sel = tf.function(select).get_concrete_function(
        tf.TensorSpec([], tf.float32), tf.TensorSpec([], tf.float32))
    add = tf.function(lambda a, b: a + b).get_concrete_function(
        tf.TensorSpec([], tf.float32), tf.TensorSpec([], tf.float32))

    def fn(x, s):
        return xla.select_and_scatter(x, [1, 3, 3, 1], [1, 2, 2, 1],
                                      [[0, 0], [1, 1], [1, 1], [0, 0]], s,
                                      tf.constant(0.5), sel, add)
    return fn


# (select, whether it is the first extremum: one primitive; else tap by tap)
SELECTS = {"first_min": (lambda a, b: a <= b, True),
           "last_max": (lambda a, b: a > b, False)}


@pytest.mark.parametrize("name", sorted(SELECTS))
def test_selects_through_tf2xla_calls_give_xla_numbers(name):
    # XlaSelectAndScatter's functions arrive wrapped in calls, and with a
    # non-zero init value.
    select, one_primitive = SELECTS[name]
    x = tf.constant(NEG)
    s = tf.constant(rng.normal(size=(2, 4, 4, 2)).astype(np.float32))
    fn = _select_and_scatter(select)
    want = tf.function(fn, jit_compile=True, autograph=False)(x, s)
    bridged = BridgedFunction(tf.function(fn, jit_compile=True, autograph=False))
    got = bridged(x, s)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6, atol=1e-6)
    _, _, _, program = bridged.program((x, s))
    names = [n.primitive.name for n in program.graph.nodes]
    assert ("select_and_scatter_add" in names) == one_primitive
