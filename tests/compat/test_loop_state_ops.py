"""internal_ops.get_current_iteration_counter and internal_ops.fifo (issue
12, item 4): the iteration of the loop the op runs in (loops.repeat, a
tf.range loop of IPUStrategy.run on two replicas, nested loops, a
pipeline's gradient accumulation iterations) and a FIFO that returns x of
`depth` runs before, compiled through the TensorFlow front end."""

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

import keras_ipu as ipu  # noqa: E402
from keras_ipu import pipelining_ops  # noqa: E402

counter = ipu.internal_ops.get_current_iteration_counter


def test_counter_in_repeat_nested_loops_and_outside():
    outfeed = ipu.ipu_outfeed_queue.IPUOutfeedQueue()

    def body():
        inner = tf.while_loop(lambda j, s: j < 3, lambda j, s: (j + 1, s + 10 * counter()),
                              (0, 0))[1]
        return outfeed.enqueue((counter(), inner))

    def program():
        with tf.control_dependencies([ipu.loops.repeat(4, body)]):
            return counter()

    (top,) = ipu.ipu_compiler.compile(program)
    steps, inner = outfeed.dequeue()
    np.testing.assert_array_equal(steps.numpy(), [0, 1, 2, 3])
    np.testing.assert_array_equal(inner.numpy(), [30] * 4)  # 10 x (0 + 1 + 2)
    assert top.numpy() == 0 and top.dtype == tf.int32


def test_counter_in_a_replicated_strategy_loop(configure_ipus):
    configure_ipus(2)
    strategy = ipu.ipu_strategy.IPUStrategy()
    outfeed = ipu.ipu_outfeed_queue.IPUOutfeedQueue()

    @tf.function(jit_compile=True)
    def loop():
        for _ in tf.range(3):
            outfeed.enqueue(counter() * 10 + tf.cast(
                ipu.replication_ops.replication_index(), tf.int32))

    with strategy.scope():
        strategy.run(loop)
    np.testing.assert_array_equal(outfeed.dequeue().numpy(), [[0, 1], [10, 11], [20, 21]])


def test_counter_in_a_pipeline_counts_gradient_accumulation_iterations(configure_ipus):
    configure_ipus(2)  # the two stages' IPUs
    dataset = tf.data.Dataset.from_tensor_slices(np.arange(16, dtype=np.float32)).batch(
        2, drop_remainder=True)
    infeed = ipu.ipu_infeed_queue.IPUInfeedQueue(dataset)
    outfeed = ipu.ipu_outfeed_queue.IPUOutfeedQueue()

    def stage1(x):
        return x, counter()

    def stage2(x, first):
        return {"first": first, "second": counter(), "x": x}

    def model():
        return pipelining_ops.pipeline([stage1, stage2], gradient_accumulation_count=4,
                                       repeat_count=2, infeed_queue=infeed,
                                       outfeed_queue=outfeed)

    ipu.ipu_compiler.compile(model)
    out = outfeed.dequeue()
    np.testing.assert_array_equal(out["first"].numpy(), [0, 1, 2, 3, 0, 1, 2, 3])
    np.testing.assert_array_equal(out["second"].numpy(), [0, 1, 2, 3, 0, 1, 2, 3])
    np.testing.assert_array_equal(out["x"].numpy().reshape(-1), np.arange(16))


@pytest.mark.parametrize("depth", [1, 3])
def test_fifo_returns_x_of_depth_runs_before_across_executions(depth):
    outfeed = ipu.ipu_outfeed_queue.IPUOutfeedQueue()

    def body(offset):
        x = tf.fill([2], tf.cast(counter(), tf.float32) + offset)
        return offset, outfeed.enqueue(ipu.internal_ops.fifo(x, depth))

    for offset in (0.0, 100.0):
        ipu.ipu_compiler.compile(lambda: ipu.loops.repeat(5, body, [tf.constant(offset)]))
    got = outfeed.dequeue().numpy()[:, 0]
    sent = np.array([0, 1, 2, 3, 4, 100, 101, 102, 103, 104], np.float32)
    # Zeros before the first `depth` values (Graphcore: unspecified); then
    # each value `depth` runs late, the queue kept between executions.
    np.testing.assert_array_equal(got, np.concatenate([np.zeros(depth), sent[:-depth]]))


def test_fifo_depth_zero_is_x_and_no_gradient_flows():
    x = tf.constant([1.0, 2.0])
    assert ipu.internal_ops.fifo(x, 0) is x

    def step(v):
        with tf.GradientTape() as tape:
            tape.watch(v)
            y = tf.reduce_sum(ipu.internal_ops.fifo(v * 3, 1) + v * 2)
        return tape.gradient(y, v)

    (grad,) = ipu.ipu_compiler.compile(step, inputs=[x])
    np.testing.assert_array_equal(grad.numpy(), [2.0, 2.0])


def test_fifos_of_two_loops_and_of_one_tensor_keep_their_own_queues():
    """Two FIFOs of one tensor, and a FIFO in a second loop whose body
    names its ops as the first's: each its own queue."""
    outfeed = ipu.ipu_outfeed_queue.IPUOutfeedQueue()

    def body(scale):
        def run():
            x = tf.cast(counter(), tf.float32) * scale
            return outfeed.enqueue((ipu.internal_ops.fifo(x, 2), ipu.internal_ops.fifo(x, 2)))
        return run

    def program():
        first = ipu.loops.repeat(4, body(1.0))
        with tf.control_dependencies([first]):
            return ipu.loops.repeat(4, body(10.0))

    ipu.ipu_compiler.compile(program)
    one, two = (t.numpy() for t in outfeed.dequeue())
    np.testing.assert_array_equal(one, [0, 0, 0, 1, 0, 0, 0, 10])
    np.testing.assert_array_equal(two, one)
