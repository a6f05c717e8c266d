"""Graphcore's reduce_scatter_op and all_to_all_op (issue 12, item 4) in
TensorFlow code run by IPUStrategy.run on 2 and 4 simulated replicas,
inside a loop, compared with NumPy; Graphcore's checks and their errors."""

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

import keras_ipu as ipu  # noqa: E402
from keras_ipu.device.config import system_config  # noqa: E402

STEPS = 2


def _each_replica(n, body, *inputs):
    """body(x) run by IPUStrategy.run on n replicas for STEPS loop
    iterations, x = inputs + 10 * replica + step: the outfeed's values,
    indexed [step][replica], as a list per output of body."""
    cfg = ipu.config.IPUConfig()
    cfg.auto_select_ipus = n
    cfg.configure_ipu_system()
    try:
        strategy = ipu.ipu_strategy.IPUStrategy()
        outfeed = ipu.ipu_outfeed_queue.IPUOutfeedQueue()

        @tf.function(jit_compile=True)
        def loop():
            replica = tf.cast(ipu.replication_ops.replication_index(), tf.float32)
            for step in tf.range(STEPS):
                shift = 10.0 * replica + tf.cast(step, tf.float32)
                outfeed.enqueue(body(*[tf.constant(a) + shift for a in inputs]))

        with strategy.scope():
            strategy.run(loop)
        out = outfeed.dequeue()
        return [np.asarray(o) for o in tf.nest.flatten(out)]
    finally:
        system_config.reset_ipu_configuration()


def _operands(base, n):
    return [[base + 10.0 * r + s for r in range(n)] for s in range(STEPS)]


X5 = np.arange(5, dtype=np.float32)


@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("op, reduce", [
    ("COLLECTIVE_OP_ADD", lambda xs: np.sum(xs, 0)),
    ("COLLECTIVE_OP_MAX", lambda xs: np.max(xs, 0)),
    ("COLLECTIVE_OP_MEAN", lambda xs: np.mean(xs, 0)),
    ("COLLECTIVE_OP_SQUARE_ADD", lambda xs: np.sum(np.square(xs), 0)),
])
def test_reduce_scatter_pads_and_scatters_in_replica_order(n, op, reduce):
    (got,) = _each_replica(
        n, lambda x: ipu.reduce_scatter_op.reduce_scatter(x, replication_factor=n, op=op), X5)
    block = -(-5 // n)
    assert got.shape == (STEPS, n, block)
    for step, xs in enumerate(_operands(X5, n)):
        padded = np.pad(reduce(np.array(xs)), (0, block * n - 5))
        for r in range(n):
            np.testing.assert_allclose(got[step, r], padded[r * block:(r + 1) * block],
                                       rtol=1e-6)


def test_reduce_scatter_groups_lists_and_local():
    """Groups of 2 of 4 replicas (Graphcore's test_grouped_reduce_scatter),
    a list of two tensors, and LOCAL (each replica's own block)."""
    y = np.arange(4, dtype=np.float32) * 3
    grouped, second, local = _each_replica(4, lambda a, b: (
        ipu.reduce_scatter_op.reduce_scatter([a, b], replication_factor=2),
        ipu.reduce_scatter_op.reduce_scatter(a, 4, op="COLLECTIVE_OP_LOCAL")), X5[:4], y)
    for step in range(STEPS):
        xs, ys = np.array(_operands(X5[:4], 4)[step]), np.array(_operands(y, 4)[step])
        for r in range(4):
            group = slice(2 * (r // 2), 2 * (r // 2) + 2)
            part = slice(2 * (r % 2), 2 * (r % 2) + 2)
            np.testing.assert_allclose(grouped[step, r], xs[group].sum(0)[part])
            np.testing.assert_allclose(second[step, r], ys[group].sum(0)[part])
            np.testing.assert_allclose(local[step, r], xs[r][r:r + 1])


def test_all_gather_in_groups():
    """Graphcore's test_grouped_all_gather: group sizes 1, 2 and 4 of 4."""
    x = np.array([0.0, 0.0, 1.0, 2.0], np.float32)
    ones, twos, fours = _each_replica(4, lambda t: tuple(
        ipu.all_to_all_op.all_gather(t, replication_factor=k) for k in (1, 2, 4)), x)
    for step, xs in enumerate(_operands(x, 4)):
        xs = np.array(xs)
        for r in range(4):
            np.testing.assert_array_equal(ones[step, r], xs[r:r + 1])
            np.testing.assert_array_equal(twos[step, r], xs[2 * (r // 2):2 * (r // 2) + 2])
            np.testing.assert_array_equal(fours[step, r], xs)


@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("split, concat", [(0, 0), (0, 1), (1, 0)])
def test_all_to_all_matches_xla_semantics(n, split, concat):
    x = np.arange(32, dtype=np.float32).reshape(8, 4) / 7
    (got,) = _each_replica(n, lambda t: ipu.all_to_all_op.all_to_all(
        t, split_dimension=split, concat_dimension=concat, replication_factor=n), x)
    for step, xs in enumerate(_operands(x, n)):
        for r in range(n):
            want = np.concatenate([np.split(xs[m], n, axis=split)[r] for m in range(n)],
                                  axis=concat)
            np.testing.assert_allclose(got[step, r], want, rtol=1e-6)


def test_all_to_all_gradient_is_the_swapped_all_to_all():
    """d sum(w * all_to_all(x)) / dx on each replica: w's blocks sent back
    by the all-to-all with split and concat swapped."""
    x = np.arange(8, dtype=np.float32).reshape(4, 2)
    w = np.arange(8, dtype=np.float32).reshape(2, 4) + 1

    def body(t):
        with tf.GradientTape() as tape:
            tape.watch(t)
            y = ipu.all_to_all_op.all_to_all(t, 0, 1, replication_factor=2)
            loss = tf.reduce_sum(y * tf.constant(w))
        return tape.gradient(loss, t)

    (got,) = _each_replica(2, body, x)
    for m in range(2):
        # Replica m's rows 2r..2r+2 went to replica r at columns 2m..2m+2.
        want = np.concatenate([w[:, 2 * m:2 * m + 2] for r in range(2)], axis=0)
        np.testing.assert_allclose(got[0, m], want)


def test_outside_replication_a_group_of_one_is_the_operand():
    out = ipu.ipu_compiler.compile(
        lambda x: (ipu.reduce_scatter_op.reduce_scatter(x, 1),
                   ipu.all_to_all_op.all_gather(x, 1),
                   ipu.all_to_all_op.all_to_all(x, 0, 0, 1)), inputs=[tf.constant(X5)])
    np.testing.assert_array_equal(out[0].numpy(), X5)
    np.testing.assert_array_equal(out[1].numpy(), X5[None])
    np.testing.assert_array_equal(out[2].numpy(), X5)


def test_graphcore_checks():
    with pytest.raises(ValueError, match="Shape must be rank 1 but is rank 2"):
        ipu.reduce_scatter_op.reduce_scatter([tf.zeros((2, 2))], replication_factor=2)
    with pytest.raises(ValueError, match="COLLECTIVE_OP_ADD"):
        ipu.reduce_scatter_op.reduce_scatter(tf.zeros(4), 2, op="SUM")
    with pytest.raises(ValueError, match=r"interval \[0, 2\)"):
        ipu.all_to_all_op.all_to_all(tf.zeros((4, 2)), 2, 0, 2)
    with pytest.raises(ValueError, match="equal blocks"):
        ipu.all_to_all_op.all_to_all(tf.zeros((3, 2)), 0, 0, 2)
    with pytest.raises(ValueError, match=r"The replica group size \(got 3\) does not evenly "
                                         r"divide the total number of replicas \(got 4\)"):
        _each_replica(4, lambda t: ipu.all_to_all_op.all_gather(t, 3), X5)


def test_the_collectives_are_costed_on_the_links():
    """The imported operators are the device's collective primitives with
    their link traffic ([RING] halves; here 4 replicas, 8 float32)."""
    from keras_ipu.frontends.tensorflow.function import BridgedFunction

    bridged = BridgedFunction(lambda t: (ipu.reduce_scatter_op.reduce_scatter(t, 4),
                                         ipu.all_to_all_op.all_gather(t, 4)))
    _, _, _, prog = bridged.program((tf.zeros([8]),), replicas=4)
    exe = bridged.executable(prog)
    costs = {}
    for node in exe.graph.nodes:
        if node.primitive.name.startswith("cross_replica_"):
            cost = node.primitive.cost([v.aval for v in node.inputs],
                                       [v.aval for v in node.outputs], **node.params)
            costs[node.primitive.name] = (cost.link_bytes, cost.link_steps)
    # reduce-scatter of 32 bytes: 3/4 of them in 3 steps; all-gather of the
    # gathered [4, 8] (128 bytes): 3/4 in 3 steps.
    assert costs == {"cross_replica_reduce_scatter": (24, 3),
                     "cross_replica_all_gather": (96, 3)}
