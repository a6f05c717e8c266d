"""embedding_ops.HostEmbedding (issue 12, item 4): a table on the host,
looked up and updated by SGD from the compiled program through host data
streams; compared with NumPy. Lookups in a loop and on two replicas, the
gradient-accumulating spec, the streams' bytes in the program's costs."""

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

import keras_ipu as ipu  # noqa: E402

embedding_ops = ipu.embedding_ops
TABLE = np.arange(24, dtype=np.float32).reshape(6, 4) / 10


def _embedding(name, spec=None):
    return embedding_ops.create_host_embedding(
        name, shape=[6, 4], dtype=tf.float32, optimizer_spec=spec,
        initializer=tf.constant_initializer(TABLE))


def test_lookup_is_served_by_the_host_and_clipped():
    embedding = _embedding("lookup_only")
    np.testing.assert_array_equal(embedding.get_embedding_tensor().numpy(), TABLE)
    ids = np.array([[0, 5], [2, 9]], np.int32)  # 9 is clipped to 5
    with embedding.register():
        (rows,) = ipu.ipu_compiler.compile(lambda i: embedding.lookup(i),
                                           inputs=[tf.constant(ids)])
    np.testing.assert_array_equal(rows.numpy(), TABLE[np.clip(ids, 0, 5)])
    with pytest.raises(RuntimeError, match="'lookup_only' is not registered"):
        ipu.ipu_compiler.compile(lambda i: embedding.lookup(i), inputs=[tf.constant(ids)])


def _train(embedding, ids, steps=1):
    """`steps` compiled steps of loss = sum(lookup(ids) * W): the gradient
    of every looked-up row is W's row."""
    w = np.arange(len(ids) * 4, dtype=np.float32).reshape(len(ids), 4) / 100

    def step(i):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(embedding.lookup(i) * w)
        return tape.gradient(loss, embedding.trainable_variable)

    with embedding.register():
        for _ in range(steps):
            (zero,) = ipu.ipu_compiler.compile(step, inputs=[tf.constant(ids)])
            assert zero.numpy() == 0
    return w


def test_sgd_updates_the_host_table_with_the_rows_gradients():
    spec = embedding_ops.HostEmbeddingOptimizerSpec(0.5)
    embedding = _embedding("sgd", spec)
    ids = np.array([1, 3, 1], np.int32)
    w = _train(embedding, ids)
    want = TABLE.copy()
    np.subtract.at(want, ids, 0.5 * w)  # row 1 twice: its two gradients add
    np.testing.assert_allclose(embedding.get_embedding_tensor().numpy(), want, rtol=1e-6)


def test_gradient_accumulation_spec_applies_the_sum_every_factor_updates():
    spec = embedding_ops.HostEmbeddingSGDGAOptimizerSpec(0.5, accumulation_factor=2)
    assert spec.get_accumulation_factor() == 2 and spec.get_learning_rate() == 0.5
    embedding = _embedding("sgd_ga", spec)
    ids = np.array([2, 4], np.int32)
    _train(embedding, ids, steps=1)
    np.testing.assert_array_equal(embedding.get_embedding_tensor().numpy(), TABLE)
    w = _train(embedding, ids, steps=2)  # a new registration: two more updates
    want = TABLE.copy()
    np.subtract.at(want, ids, 0.5 * 2 * w)
    np.testing.assert_allclose(embedding.get_embedding_tensor().numpy(), want, rtol=1e-6)


def test_lookups_each_loop_iteration_on_two_replicas(configure_ipus):
    embedding = _embedding("replicated")
    configure_ipus(2)
    strategy = ipu.ipu_strategy.IPUStrategy()
    outfeed = ipu.ipu_outfeed_queue.IPUOutfeedQueue()

    @tf.function(jit_compile=True)
    def loop():
        replica = tf.cast(ipu.replication_ops.replication_index(), tf.int32)
        for step in tf.range(3):
            outfeed.enqueue(embedding.lookup(tf.reshape(step + 3 * replica, [1])))

    with embedding.register(), strategy.scope():
        strategy.run(loop)
    got = outfeed.dequeue().numpy()  # [step, replica, 1, 4]
    for step in range(3):
        for replica in range(2):
            np.testing.assert_array_equal(got[step, replica, 0], TABLE[step + 3 * replica])


def test_the_streams_are_costed_as_host_transfers():
    from keras_ipu.frontends.tensorflow.function import BridgedFunction

    embedding = _embedding("costed", embedding_ops.HostEmbeddingOptimizerSpec(0.1))

    def step(i):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(embedding.lookup(i))
        return tape.gradient(loss, embedding.trainable_variable)

    bridged = BridgedFunction(step)
    _, _, _, prog = bridged.program((tf.zeros([5], tf.int32),))
    exe = bridged.executable(prog)
    moved = []
    for node in exe.graph.nodes:
        if node.primitive.name in ("stream_to_host", "stream_from_host"):
            cost = node.primitive.cost([v.aval for v in node.inputs],
                                       [v.aval for v in node.outputs], **node.params)
            moved.append((node.primitive.name, cost.bytes_in, cost.bytes_out))
    # The lookup: 5 int32 indices out, 5 rows of 4 float32 in; the update:
    # the indices and the rows' gradients out.
    assert sorted(moved) == sorted([("stream_to_host", 20, 0), ("stream_from_host", 0, 80),
                                    ("stream_to_host", 20, 0), ("stream_to_host", 80, 0)])


def test_checks():
    with pytest.raises(ValueError, match="not a HostEmbeddingOptimizerSpec"):
        _embedding("bad", spec=0.1)
    with pytest.raises(ValueError, match="Unknown partition strategy"):
        embedding_ops.create_host_embedding("p", [2, 2], tf.float32, partition_strategy="ROW")
    with pytest.raises(ValueError, match="only SGD"):
        embedding_ops.HostEmbeddingOptimizerSpec(0.1, optimizer_name="Adam")
    embedding = _embedding("twice")
    with embedding.register():
        with pytest.raises(RuntimeError, match="already registered"):
            with embedding.register():
                pass


def test_a_v1_optimizers_minimize_updates_the_host_table():
    """Graphcore's TF1 usage: minimize(loss) differentiates the trainable
    variables collection, where the lookup put its scalar variable."""
    embedding = _embedding("v1_minimize", embedding_ops.HostEmbeddingOptimizerSpec(0.5))

    def step(i):
        loss = tf.reduce_sum(embedding.lookup(i))
        train = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss)
        with tf.control_dependencies([train]):
            return tf.identity(loss)

    with embedding.register():
        (loss,) = ipu.ipu_compiler.compile(step, inputs=[tf.constant([0, 5], tf.int32)])
    np.testing.assert_allclose(loss.numpy(), TABLE[[0, 5]].sum(), rtol=1e-6)
    want = TABLE.copy()
    want[[0, 5]] -= 0.5
    np.testing.assert_allclose(embedding.get_embedding_tensor().numpy(), want, rtol=1e-6)
