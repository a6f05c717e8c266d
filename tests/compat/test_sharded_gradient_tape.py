"""sharding.enable_sharded_gradient_tape (issue 12): tf.GradientTape's
backward ops inherit their forward op's ipu_shard, so the program compiles
with each gradient op on its forward op's IPU."""

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

import keras_ipu as ipu  # noqa: E402
from keras_ipu.device.ir import subgraphs  # noqa: E402
from keras_ipu.frontends.tensorflow.function import bridge  # noqa: E402

RNG = np.random.default_rng(4)
W0 = RNG.normal(size=(4, 3)).astype("float32")
W1 = RNG.normal(size=(3, 2)).astype("float32")
X = RNG.normal(size=(5, 4)).astype("float32")


@pytest.fixture
def sharded_tape():
    """enable_sharded_gradient_tape() for the test; TensorFlow's own
    gradient recording is put back afterwards (Graphcore's switch has no
    off, and other tests of the process must not see it)."""
    from tensorflow.python import pywrap_tfe
    from tensorflow.python.eager import backprop
    from tensorflow.python.eager import execute

    ipu.sharding.enable_sharded_gradient_tape()
    yield
    execute.record_gradient = backprop.record_gradient
    pywrap_tfe.TFE_Py_RegisterGradientFunction(backprop._gradient_function)  # noqa: SLF001


def step(x, w0, w1):
    with tf.GradientTape() as tape:
        tape.watch([w0, w1])
        with tf.name_scope("layer0"), ipu.scopes.ipu_shard(0):
            h = tf.tanh(tf.matmul(x, w0))
        with tf.name_scope("layer1"), ipu.scopes.ipu_shard(1):
            loss = tf.reduce_sum(tf.square(tf.matmul(h, w1)))
    return (loss,) + tuple(tape.gradient(loss, [w0, w1]))


def _gradient_shards(graph):
    """{gradient op name: its shards} of a traced graph, and the layer
    (name scope) whose forward op each differentiates."""
    return {op.name: ipu.sharding.get_sharding(op) for op in graph.get_operations()
            if op.name.startswith("gradient_tape/layer")}


def _nodes(graph):
    for node in graph.nodes:
        yield node
        for sub in subgraphs(node):
            yield from _nodes(sub)


def _placed_gradient_products():
    """{op name: IPU} of the backward pass's products, step compiled."""
    bridged = bridge(tf.function(step))
    outputs = bridged(tf.constant(X), tf.constant(W0), tf.constant(W1))
    (exe,) = bridged.executables()
    assert exe.ipus == (0, 1)
    placed = {n.source: n.ipu for n in _nodes(exe.graph)
              if isinstance(n.source, str) and n.source.startswith("gradient_tape/layer")
              and n.primitive.name == "dot_general"}
    return outputs, placed


def test_each_gradient_op_gets_its_forward_ops_shard(sharded_tape, configure_ipus):
    configure_ipus(2)
    graph = tf.function(step).get_concrete_function(X, W0, W1).graph
    shards = _gradient_shards(graph)
    assert shards and all(shards.values()), shards
    for name, shard in shards.items():
        assert shard == [int(name.split("/")[1][len("layer"):])], name

    outputs, placed = _placed_gradient_products()
    # The products of each layer's backward pass (layer0: dW0; layer1: dW1
    # and dh), each on its forward op's IPU.
    assert sorted(placed.values()) == [0, 1, 1]
    for source, where in placed.items():
        assert where == int(source.split("/")[1][len("layer"):]), source
    with tf.GradientTape() as tape:
        w0, w1 = tf.constant(W0), tf.constant(W1)
        tape.watch([w0, w1])
        loss = tf.reduce_sum(tf.square(tf.tanh(X @ w0) @ w1))
    expected = [loss] + tape.gradient(loss, [w0, w1])
    for got, want in zip(outputs, expected):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-6)


def test_without_it_gradient_ops_carry_no_shard(configure_ipus):
    configure_ipus(2)
    graph = tf.function(step).get_concrete_function(X, W0, W1).graph
    shards = _gradient_shards(graph)
    assert shards and not any(shards.values())
    # Unmarked, a gradient op runs where the values it reads are, which
    # here puts one of them off its forward op's IPU.
    _, placed = _placed_gradient_products()
    assert len(placed) == 3
    assert any(where != int(source.split("/")[1][len("layer"):])
               for source, where in placed.items()), placed
