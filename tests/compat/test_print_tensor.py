"""internal_ops.print_tensor (issue 12, item 4): printed by the host on
standard error each time the compiled program reaches it, as Graphcore's:
in ipu_compiler.compile (the reference's first example), every iteration
of a loop in IPUStrategy.run (as a control dependency, or not used at all: a TensorFlow 2 function
compiles every op it makes), once per replica."""

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

import keras_ipu as ipu  # noqa: E402


def _printed(capfd, name):
    return [line for line in capfd.readouterr().err.splitlines() if line.startswith(name)]


def test_returned_print_op_prints_each_execution(capfd):
    def my_net(v):
        print_op = ipu.internal_ops.print_tensor(v, name="v_in")
        v = v + 1
        return v, print_op

    v = tf.constant([[1.0, 2.0], [3.0, 4.0]])
    capfd.readouterr()
    for _ in range(2):
        out, printed = ipu.ipu_compiler.compile(my_net, inputs=[v])
    np.testing.assert_array_equal(out.numpy(), v.numpy() + 1)
    np.testing.assert_array_equal(printed.numpy(), v.numpy())
    assert _printed(capfd, "v_in") == ["v_in: [[1., 2.],", "v_in: [[1., 2.],"]


def test_control_dependency_prints_every_loop_iteration_of_every_replica(capfd, configure_ipus):
    configure_ipus(2)
    strategy = ipu.ipu_strategy.IPUStrategy()
    outfeed = ipu.ipu_outfeed_queue.IPUOutfeedQueue()

    @tf.function(jit_compile=True)
    def loop():
        replica = tf.cast(ipu.replication_ops.replication_index(), tf.float32)
        for step in tf.range(3):
            x = tf.cast(step, tf.float32) + 10.0 * replica
            with tf.control_dependencies([ipu.internal_ops.print_tensor(x, "x_step")]):
                outfeed.enqueue(x * 2)
            ipu.internal_ops.print_tensor(x * 100, "not_used")

    capfd.readouterr()
    with strategy.scope():
        strategy.run(loop)
    np.testing.assert_array_equal(outfeed.dequeue().numpy(), [[0, 20], [2, 22], [4, 24]])
    err = capfd.readouterr().err
    lines = sorted(line for line in err.splitlines() if line.startswith("x_step"))
    assert lines == sorted(f"x_step: {v:.0f}." for v in (0, 1, 2, 10, 11, 12))
    unused = sorted(line for line in err.splitlines() if line.startswith("not_used"))
    assert unused == sorted(f"not_used: {v:.0f}." for v in (0, 100, 200, 1000, 1100, 1200))


def test_the_print_is_a_host_transfer_of_the_tensors_bytes():
    from keras_ipu.frontends.tensorflow.function import BridgedFunction

    bridged = BridgedFunction(lambda t: ipu.internal_ops.print_tensor(t, "costed") * 2)
    _, _, _, prog = bridged.program((tf.zeros((8, 4)),))
    exe = bridged.executable(prog)
    (node,) = [s for s in exe.graph.nodes if s.primitive.name == "stream_to_host"]
    cost = node.primitive.cost([v.aval for v in node.inputs], [v.aval for v in node.outputs],
                               **node.params)
    assert cost.bytes_in == 8 * 4 * 4


def test_gradients_pass_through_the_print(capfd):
    def step(v):
        with tf.GradientTape() as tape:
            tape.watch(v)
            y = tf.reduce_sum(ipu.internal_ops.print_tensor(v * 3, "tripled") ** 2)
        return tape.gradient(y, v)

    (grad,) = ipu.ipu_compiler.compile(step, inputs=[tf.constant([1.0, 2.0])])
    np.testing.assert_allclose(grad.numpy(), [18.0, 36.0])
    assert _printed(capfd, "tripled") == ["tripled: [3., 6.]"]
