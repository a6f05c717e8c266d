"""keras_ipu.ops.cross_replica_ops: Popops cross-replica operators. (Graphcore's
`tensorflow.python.ipu.ops.cross_replica_ops`, also `keras_ipu.cross_replica_ops`).

TensorFlow functions for programs compiled through the TensorFlow front end
(IPUStrategy.run, ipu_compiler.compile, the estimators): the sum is XLA's
all-reduce (`XlaAllReduce` over all replicas), which the front end imports
as the simulator's cross-replica sum (ring all-reduce over the IPU-Links),
and the identity outside a replicated program, as on one IPU.
"""

import threading


_trace = threading.local()


def reductions_traced():
    """How many cross-replica reductions the functions traced by this
    thread made (the estimator checks a replicated training step has one)."""
    return getattr(_trace, "count", 0)


def _all_replicas_sum(x):
    import tensorflow as tf
    from tensorflow.compiler.tf2xla.ops import gen_xla_ops

    _trace.count = reductions_traced() + 1
    # An empty group assignment is one group of every replica.
    return gen_xla_ops.xla_all_reduce(x, tf.zeros((0, 0), tf.int32), "Add", "CrossReplica")


def _check_group(replica_group_size):
    if replica_group_size is not None:
        raise NotImplementedError(
            f"replica_group_size={replica_group_size}: the TensorFlow front end sums "
            "across all replicas only; pass replica_group_size=None.")


def cross_replica_sum(x, replica_group_size=None, name=None):
    """Sum the input tensor across replicas.

    Args:
      x: the local tensor to sum.
      replica_group_size: None (one group of all the replicas; groups of
        fewer replicas are not supported).
      name: optional op name.

    Returns:
      A Tensor which is summed across the replicas.
    """
    import tensorflow as tf

    _check_group(replica_group_size)
    with tf.name_scope(name or "cross_replica_sum"):
        return _all_replicas_sum(tf.convert_to_tensor(x))


def cross_replica_mean(x, replica_group_size=None, name=None):
    """Computes the mean of the input tensor across replicas (the sum
    divided by the number of replicas, itself an all-reduce of ones)."""
    import tensorflow as tf

    _check_group(replica_group_size)
    with tf.name_scope(name or "cross_replica_mean"):
        x = tf.convert_to_tensor(x)
        count = _all_replicas_sum(tf.ones((), x.dtype))
        return _all_replicas_sum(x) / count


def assume_equal_across_replicas(tensors, inplace=False):
    """Mark tensors as equal across replicas: Poplar uses the mark to skip
    its divergent-control-flow check at compile time. The simulator makes
    no such check on TensorFlow programs, so the values pass through
    unchanged (identities), matching the tensors' shapes and types."""
    import tensorflow as tf

    return tf.nest.map_structure(tf.identity, tensors)
