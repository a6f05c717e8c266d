"""TensorFlow code run by IPUStrategy.run is traced in a TensorFlow replica
context (frontends/tensorflow/replica_context.py): its all_reduce is an
XLA all-reduce over the program's replicas, and over the other instances of
a multi-process job (faked here: the multi-process jobs themselves are
tests/distributed/test_multiprocess.py's)."""

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

import keras_ipu as ipu  # noqa: E402
from keras_ipu.device.simulator import partition  # noqa: E402
from keras_ipu.device.config import system_config  # noqa: E402

DATA = np.arange(16, dtype=np.float32).reshape(4, 4)


@pytest.fixture
def ipus():
    def configure(n):
        cfg = ipu.config.IPUConfig()
        cfg.auto_select_ipus = n
        cfg.configure_ipu_system()
        return ipu.ipu_strategy.IPUStrategy()

    yield configure
    system_config.reset_ipu_configuration()


def _step():
    @tf.function(jit_compile=True)
    def step(iterator):
        x = next(iterator)
        ctx = tf.distribute.get_replica_context()
        per_example = tf.reduce_sum(x, axis=1)
        return {
            "sum": ctx.all_reduce("SUM", tf.reduce_sum(x)),
            "mean": ctx.all_reduce(tf.distribute.ReduceOp.MEAN, tf.reduce_sum(x)),
            "in_sync": ctx.num_replicas_in_sync,
            "average_loss": tf.nn.compute_average_loss(per_example),
        }

    return step


def test_replicas_reduce_as_on_graphcores_ipu_strategy(ipus):
    strategy = ipus(2)
    dataset = tf.data.Dataset.from_tensor_slices(DATA).batch(2, drop_remainder=True)
    with strategy.scope():
        out = strategy.run(_step(), args=[iter(dataset)])
    # Replica 0 reads rows 0-1, replica 1 rows 2-3; the result is replica 0's.
    assert float(out["sum"]) == DATA.sum()
    assert float(out["mean"]) == DATA.sum() / 2
    # IPUStrategy reports one replica in sync, as Graphcore's: the average
    # loss divides by the replica's own batch.
    assert int(out["in_sync"]) == 1
    assert float(out["average_loss"]) == DATA[:2].sum() / 2


def test_one_replica_alone_is_left_as_it_is(ipus):
    strategy = ipus(1)
    dataset = tf.data.Dataset.from_tensor_slices(DATA).batch(2, drop_remainder=True)
    with strategy.scope():
        out = strategy.run(_step(), args=[iter(dataset)])
    assert float(out["sum"]) == float(out["mean"]) == DATA[:2].sum()


def test_one_replica_per_instance_still_reduces_over_the_instances(ipus, monkeypatch):
    # A job of two instances of one replica each; the other instance's
    # partial sum equals this one's.
    monkeypatch.setattr(partition, "configured_instances", lambda system=None: (2, 0))
    monkeypatch.setattr(partition, "sum_over_instances", lambda array: 2 * np.asarray(array))
    strategy = ipus(1)
    dataset = tf.data.Dataset.from_tensor_slices(DATA).batch(2, drop_remainder=True)
    with strategy.scope():
        out = strategy.run(_step(), args=[iter(dataset)])
    assert float(out["sum"]) == 2 * DATA[:2].sum()
    assert float(out["mean"]) == DATA[:2].sum()
