"""keras_ipu.ops.replication_ops: Operations to be used in replicated mode. (Graphcore's
`tensorflow.python.ipu.ops.replication_ops`, also `keras_ipu.replication_ops`)."""


def replication_index(name=None):
    """The index of the replica running this program (an int32 scalar), in
    TensorFlow code compiled through the TensorFlow front end: XLA's
    replica-id, which the front end imports as the running replica's index
    (0 without replication)."""
    import tensorflow as tf
    from tensorflow.compiler.tf2xla.ops import gen_xla_ops

    with tf.name_scope(name or "replication_index"):
        return tf.cast(gen_xla_ops.xla_replica_id(), tf.int32)
