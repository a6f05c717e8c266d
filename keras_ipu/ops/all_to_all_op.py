"""keras_ipu.ops.all_to_all_op: Popops all-to-all and all-gather operators across replicas. (Graphcore's
`tensorflow.python.ipu.ops.all_to_all_op`, also `keras_ipu.all_to_all_op`).

Both are the device's cross-replica collectives (ops/replica_collectives.py):
the replicas of a program run by IPUStrategy.run (or ipu_compiler.compile,
the estimators) meet in them; their cost is the link traffic of the cost
model (a ring all-gather, a pairwise all-to-all).
"""

from keras_ipu.ops import replica_collectives


def all_to_all(x, split_dimension, concat_dimension, replication_factor, name=None):
    """XLA's all-to-all across the replicas
    (https://www.tensorflow.org/xla/operation_semantics#alltoall): each
    replica splits `x` into replication_factor blocks along
    `split_dimension`; replica i gets block i of every replica of its
    group, concatenated along `concat_dimension` in replica order.

    Args:
      split_dimension: a value in [0, rank) naming the dimension along which
        the operand is split (its size a multiple of replication_factor).
      concat_dimension: a value in [0, rank) naming the dimension along
        which the blocks are concatenated.
      replication_factor: the replicas in each group (consecutive groups,
        as Graphcore's other collectives; the model's replication factor
        for one group of all).
      name: optional op name.

    Returns:
      A tensor of the same size, different on each replica. Its gradient
      is the all-to-all with the two dimensions swapped (Graphcore's).
    """
    import tensorflow as tf

    k = replica_collectives.checked_group_size(replication_factor)
    with tf.name_scope(name or "all_to_all"):
        x = tf.convert_to_tensor(x)
        if not x.shape.is_fully_defined():
            raise ValueError(f"all_to_all needs a tensor of known shape, got {x.shape}.")
        rank = x.shape.rank
        for what, dim in (("split_dimension", split_dimension),
                          ("concat_dimension", concat_dimension)):
            if not (isinstance(dim, int) and 0 <= dim < rank):
                raise ValueError(f"all_to_all {what}={dim!r} must be in the interval "
                                 f"[0, {rank}) for a tensor of shape {x.shape}.")
        if x.shape[split_dimension] % k:
            raise ValueError(
                f"all_to_all: dimension {split_dimension} of {x.shape} does not split into "
                f"replication_factor={k} equal blocks.")
        return replica_collectives.exchanged(x, split_dimension, concat_dimension, k)


def all_gather(x, replication_factor, name=None):
    """Gather the data of the replicas of each group to all of them: every
    replica of a group gets the same [replication_factor, *x.shape] tensor,
    row i from the group's replica i.

    Args:
      x: the tensor or list (nest) of tensors to gather.
      replication_factor: the replicas in each group: consecutive groups
        {0..k-1}, {k..2k-1}, ... (k must divide the replicas the program
        runs on, checked when it is compiled).
      name: optional op name.

    Returns:
      A tensor, or the same structure of tensors, each [replication_factor, *x.shape].
    """
    import tensorflow as tf

    k = replica_collectives.checked_group_size(replication_factor)
    with tf.name_scope(name or "all_gather"):
        return tf.nest.map_structure(
            lambda t: replica_collectives.gathered(tf.convert_to_tensor(t), k), x)
