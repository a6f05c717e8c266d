"""Cross-replica reductions for Keras code (keras.ops tensors), as
Graphcore's `cross_replica_ops.cross_replica_sum` / `cross_replica_mean`.

Traced inside a replicated program (IPUStrategy.run, fit on a replicated
model) they reduce over its replicas; in a program of one replica (and
eagerly) they return their operand.
"""

from keras_ipu.device.primitives import collective
from keras_ipu.distribute.replication import replicas_in_trace


def _reduce(bind, x, replica_group_size):
    from keras_ipu.backend.core import convert_to_tensor

    replicas = replicas_in_trace()
    if replica_group_size is not None and (
        not isinstance(replica_group_size, int) or replica_group_size < 1
        or replicas % replica_group_size
    ):
        raise ValueError(
            f"replica_group_size={replica_group_size!r} must divide the "
            f"{replicas} replicas of the program evenly (groups of "
            "consecutive replicas). Use a divisor of the replication factor, "
            "or None for one group of all the replicas."
        )
    return bind(convert_to_tensor(x), replicas, replica_group_size)


def cross_replica_sum(x, replica_group_size=None, name=None):
    """The sum of `x` over the replicas (of each group of
    `replica_group_size` consecutive replicas)."""
    return _reduce(collective.cross_replica_sum, x, replica_group_size)


def cross_replica_mean(x, replica_group_size=None, name=None):
    """The mean of `x` over the replicas (of each group)."""
    return _reduce(collective.cross_replica_mean, x, replica_group_size)
