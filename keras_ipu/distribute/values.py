"""Values that differ from replica to replica.

`PerReplica((v0, v1, ...))` is an argument of IPUStrategy.run of which
replica r receives component r (as tf.distribute's PerReplica); made by
`strategy.experimental_distribute_values_from_function`.
"""


class PerReplica:
    __slots__ = ("values",)

    def __init__(self, values):
        self.values = tuple(values)

    def __len__(self):
        return len(self.values)

    def __repr__(self):
        items = ", ".join(f"{i}: {v!r}" for i, v in enumerate(self.values))
        return f"PerReplica:{{{items}}}"


class ValueContext:
    """What `experimental_distribute_values_from_function` tells value_fn."""

    def __init__(self, replica_id_in_sync_group, num_replicas_in_sync):
        self.replica_id_in_sync_group = replica_id_in_sync_group
        self.num_replicas_in_sync = num_replicas_in_sync

    def __repr__(self):
        return (f"ValueContext(replica_id_in_sync_group="
                f"{self.replica_id_in_sync_group}, num_replicas_in_sync="
                f"{self.num_replicas_in_sync})")
