"""IPUStrategy.run of TensorFlow code counts its replicas as Graphcore's
compiler does (poplar_compiler's NumIPUsInShards): the device's IPUs over
the IPUs one replica spans, its highest IPU + 1 rounded up to a power of
two. A 2-stage functional pipeline on 4 IPUs runs 2 replicas (it ran 4,
one per IPU, when run counted one shard); a 3-stage one takes 4 IPUs, so
a device of 2 refuses it with the compiler's message."""

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

import keras_ipu as ipu  # noqa: E402
from keras_ipu import pipelining_ops  # noqa: E402
from keras_ipu.device.simulator.system import rounded_shards  # noqa: E402
from keras_ipu.frontends.tensorflow import strategy_run  # noqa: E402

MB, COUNT = 2, 4
X = np.arange(4 * MB * COUNT * 3, dtype=np.float32).reshape(-1, 3)


def _pipelined(stages, count=COUNT):
    """A tf.function running an inference pipeline of `stages` over an
    infeed of X: the last stage sums its micro-batch over all replicas."""
    dataset = tf.data.Dataset.from_tensor_slices(X).batch(MB, drop_remainder=True)
    infeed = ipu.ipu_infeed_queue.IPUInfeedQueue(dataset)
    outfeed = ipu.ipu_outfeed_queue.IPUOutfeedQueue()

    def first(x):
        return x * 2.0

    def middle(x):
        return x + 1.0

    def last(x):
        return {"x": x, "total": ipu.cross_replica_ops.cross_replica_sum(tf.reduce_sum(x))}

    chosen = [first] + [middle] * (stages - 2) + [last]

    @tf.function(jit_compile=True)
    def program():
        pipelining_ops.pipeline(chosen, gradient_accumulation_count=count,
                                infeed_queue=infeed, outfeed_queue=outfeed)

    return program, outfeed


def test_shards_round_up_to_a_power_of_two():
    assert [rounded_shards(n) for n in range(1, 10)] == [1, 2, 4, 4, 8, 8, 8, 8, 16]


def _run_on_four_ipus(configure_ipus, calls):
    """A 2-stage pipeline run `calls` times by IPUStrategy.run on 4 IPUs."""
    configure_ipus(4)
    strategy = ipu.ipu_strategy.IPUStrategy()
    program, outfeed = _pipelined(2)
    with strategy.scope():
        for _ in range(calls):
            strategy.run(program)
    return strategy, program, outfeed.dequeue()


def test_a_two_stage_pipeline_on_four_ipus_runs_two_replicas(configure_ipus):
    strategy, program, out = _run_on_four_ipus(configure_ipus, 1)
    # [micro-batch, replica, ...]: each of the 2 replicas dequeues every
    # other micro-batch of the infeed (element i to replica i mod 2).
    x = out["x"].numpy()
    assert x.shape == (COUNT, 2, MB, 3)
    batches = X.reshape(-1, MB, 3)
    for step in range(COUNT):
        for replica in range(2):
            np.testing.assert_array_equal(x[step, replica], 2 * batches[2 * step + replica])
        # The all-reduce meets the 2 replicas (4 would have summed 4 micro-batches).
        want = 2 * (batches[2 * step].sum() + batches[2 * step + 1].sum())
        np.testing.assert_allclose(out["total"].numpy()[step], [want, want], rtol=1e-6)
    # The program was compiled for 2 replicas: its all-reduce's group (the
    # prediction's link traffic) is 2 replicas, its stages on IPUs 0 and 1.
    (bridged,) = strategy_run._replicated_of(program).by_replicas.values()
    (exe,) = bridged.executables()
    assert exe.ipus == (0, 1)
    sums = [n for n in _nodes(exe.graph) if n.primitive.name == "cross_replica_sum"]
    assert sums and {n.params["replicas"] for n in sums} == {2}
    assert strategy_run._replicated_of(program).known[strategy._ipu_device][1] == 2


def test_a_second_call_reuses_the_programs_replica_count(configure_ipus):
    _, program, out = _run_on_four_ipus(configure_ipus, 2)
    (bridged,) = strategy_run._replicated_of(program).by_replicas.values()
    assert bridged.compile_count == 1
    assert out["x"].numpy().shape == (2 * COUNT, 2, MB, 3)


def test_a_one_shard_program_keeps_a_replica_per_ipu(configure_ipus):
    configure_ipus(2)
    strategy = ipu.ipu_strategy.IPUStrategy()

    @tf.function(jit_compile=True)
    def step(x):
        return ipu.cross_replica_ops.cross_replica_sum(x)

    with strategy.scope():
        out = strategy.run(step, args=(tf.constant(3.0),))
    assert float(out) == 6.0
    assert not strategy_run._replicated_of(step).by_replicas  # the probe's program ran


def test_shards_that_do_not_divide_the_ipus_are_refused(configure_ipus):
    configure_ipus(2)
    strategy = ipu.ipu_strategy.IPUStrategy()
    program, _ = _pipelined(3, count=6)  # IPUs 0-2: 4 shards
    with strategy.scope(), pytest.raises(ValueError, match=(
            "Trying to compile a graph for an IPU device with 2 IPUs and 4 shards. "
            "The number of shards needs to divide the number of IPUs.")):
        strategy.run(program)


def _nodes(graph):
    from keras_ipu.device.ir import subgraphs

    for node in graph.nodes:
        yield node
        for sub in subgraphs(node):
            yield from _nodes(sub)
