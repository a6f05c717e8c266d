"""What anyone reading a bridged function's variables sees: the values of
its last run, from Python, a checkpoint, an eager op or another
tf.function; and what the bridged run sees: the values others assigned.
Tensors read before a run keep the values they had."""

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from keras_ipu.frontends.tensorflow.function import BridgedFunction  # noqa: E402

SHAPE = (128, 160)  # 80 KiB of float32: the run's arrays become the buffers


def _momentum_step():
    w = tf.Variable(np.ones(SHAPE, np.float32))
    m = tf.Variable(np.zeros(SHAPE, np.float32))
    small = tf.Variable(np.zeros(3, np.float32))  # copied by TensorFlow, not adopted

    def step(g):
        m.assign(0.9 * m - 0.1 * g)
        w.assign_add(m)
        small.assign_add(tf.ones(3))
        return tf.reduce_sum(w)

    return BridgedFunction(step), w, m, small


def test_python_reads_between_calls_see_each_runs_values():
    bridged, w, m, small = _momentum_step()
    g = np.full(SHAPE, 1.0, np.float32)
    bridged(g)
    np.testing.assert_allclose(w.numpy(), 0.9)
    np.testing.assert_allclose(m.numpy(), -0.1)
    np.testing.assert_array_equal(small.numpy(), 1.0)
    before = w.read_value()  # shares TensorFlow's buffer
    before_numpy = w.numpy()
    bridged(g)
    np.testing.assert_allclose(w.numpy(), 0.9 - 0.19, rtol=1e-6)
    np.testing.assert_array_equal(small.numpy(), 2.0)
    # What was read before the run keeps its values (TensorFlow's snapshot).
    np.testing.assert_allclose(before.numpy(), 0.9)
    np.testing.assert_allclose(before_numpy, 0.9)


def test_a_checkpoint_saved_after_a_run_holds_its_values(tmp_path):
    bridged, w, m, small = _momentum_step()
    bridged(np.full(SHAPE, 1.0, np.float32))
    path = tf.train.Checkpoint(w=w, m=m, small=small).write(str(tmp_path / "ckpt"))
    w2 = tf.Variable(np.zeros(SHAPE, np.float32))
    m2 = tf.Variable(np.zeros(SHAPE, np.float32))
    small2 = tf.Variable(np.zeros(3, np.float32))
    tf.train.Checkpoint(w=w2, m=m2, small=small2).read(path).assert_consumed()
    np.testing.assert_array_equal(w2.numpy(), w.numpy())
    np.testing.assert_allclose(w2.numpy(), 0.9)
    np.testing.assert_allclose(m2.numpy(), -0.1)
    np.testing.assert_array_equal(small2.numpy(), 1.0)


def test_eager_ops_and_other_functions_see_the_run_and_it_sees_them():
    bridged, w, m, small = _momentum_step()
    g = np.full(SHAPE, 1.0, np.float32)
    total = tf.function(lambda: tf.reduce_sum(w))  # reads the handle in its graph
    total()  # traced before the runs
    bridged(g)
    np.testing.assert_allclose(float(total()), 0.9 * w.shape.num_elements(), rtol=1e-5)
    np.testing.assert_allclose((w * 2.0).numpy(), 1.8)
    # Changes made outside between two runs are what the next run reads.
    w.assign_add(tf.ones(SHAPE))  # in place on the buffer the run handed over
    small.assign(np.full(3, 10.0, np.float32))
    m.assign(tf.zeros(SHAPE))
    out = bridged(g)
    np.testing.assert_allclose(m.numpy(), -0.1)
    np.testing.assert_allclose(w.numpy(), 1.9 - 0.1, rtol=1e-6)
    np.testing.assert_array_equal(small.numpy(), 11.0)
    np.testing.assert_allclose(float(out), 1.8 * w.shape.num_elements(), rtol=1e-5)


def test_small_variables_of_several_dtypes_are_written_together():
    # Arrays below ALIGN_MIN_BYTES travel packed, one flat tensor per
    # dtype, split inside the assigning graph: each must get its own part.
    step_count = tf.Variable(0, dtype=tf.int64)
    flags = tf.Variable(np.zeros((2, 3), bool))
    scales = [tf.Variable(np.full(n, float(n), np.float32)) for n in (1, 5, 7)]
    big = tf.Variable(np.ones(SHAPE, np.float32))

    def step(x):
        step_count.assign_add(1)
        flags.assign(tf.logical_not(flags))
        for k, s in enumerate(scales):
            s.assign(s * x + k)
        big.assign(big * x)
        return tf.reduce_sum(big)

    bridged = BridgedFunction(step)
    for call in (1, 2):
        bridged(np.float32(2.0))
        assert int(step_count.numpy()) == call
        np.testing.assert_array_equal(flags.numpy(), np.full((2, 3), call % 2 == 1))
        np.testing.assert_allclose(big.numpy(), 2.0 ** call)
    for k, (s, n) in enumerate(zip(scales, (1, 5, 7))):
        np.testing.assert_allclose(s.numpy(), np.full(n, (n * 2 + k) * 2 + k, np.float32))


def test_calls_with_the_same_shapes_reuse_tensorflows_trace():
    v = tf.Variable(np.zeros(4, np.float32))

    def add(x, scale=1.0):
        v.assign_add(x * scale)
        return tf.reduce_sum(v)

    bridged = BridgedFunction(add)
    asked = []
    concrete = bridged.concrete

    def counting(*args, **kwargs):
        asked.append(args)
        return concrete(*args, **kwargs)

    bridged.concrete = counting
    x = np.ones(4, np.float32)
    assert float(bridged(x)) == 4.0
    assert float(bridged(x * 2)) == 12.0
    assert len(asked) == 1
    t = tf.constant(x)  # an eager tensor: TensorFlow is asked once for it too
    assert float(bridged(t)) == 16.0
    assert float(bridged(t)) == 20.0
    assert len(asked) == 2
    # Another shape: TensorFlow traces again (and the variable's add fails
    # as TensorFlow's would).
    with pytest.raises(Exception):
        bridged(np.ones(3, np.float32))
    assert len(asked) == 3
    # A Python number is traced by value: TensorFlow is asked each time.
    assert float(bridged(x, 3.0)) == 32.0
    assert float(bridged(x, 0.5)) == 34.0
    assert len(asked) == 5
    np.testing.assert_array_equal(v.numpy(), 8.5)
