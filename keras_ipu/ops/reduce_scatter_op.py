"""keras_ipu.ops.reduce_scatter_op: Popops reduce-scatter operator. (Graphcore's
`tensorflow.python.ipu.ops.reduce_scatter_op`, also `keras_ipu.reduce_scatter_op`).

The reduction is the device's cross-replica reduce-scatter (ops/
replica_collectives.py): the replicas of a program run by IPUStrategy.run
(or ipu_compiler.compile, the estimators) meet in it, and its cost is the
ring reduce-scatter over the IPU-Links.
"""

from keras_ipu.ops import replica_collectives

# Graphcore's op -> (what the operand becomes before the reduction, the
# device's reduction); MEAN divides the sum afterwards, LOCAL reduces nothing.
_OPS = {
    "COLLECTIVE_OP_ADD": (None, "sum"),
    "COLLECTIVE_OP_MUL": (None, "prod"),
    "COLLECTIVE_OP_MIN": (None, "min"),
    "COLLECTIVE_OP_MAX": (None, "max"),
    "COLLECTIVE_OP_LOGICAL_AND": ("logical", "min"),
    "COLLECTIVE_OP_LOGICAL_OR": ("logical", "max"),
    "COLLECTIVE_OP_SQUARE_ADD": ("square", "sum"),
    "COLLECTIVE_OP_MEAN": ("mean", "sum"),
    "COLLECTIVE_OP_LOCAL": ("local", None),
}


def _scattered(x, k, op):
    import tensorflow as tf

    x = tf.convert_to_tensor(x)
    if x.shape.rank != 1:
        raise ValueError(f"Shape must be rank 1 but is rank {x.shape.rank} for "
                         f"reduce_scatter of {x.shape}.")
    before, reduction = _OPS[op]
    if before == "logical" and x.dtype != tf.bool:
        raise ValueError(f"reduce_scatter op={op} reduces booleans, got {x.dtype.name}.")
    if before == "mean" and not x.dtype.is_floating:
        raise ValueError(f"reduce_scatter op={op} needs a floating-point tensor, got "
                         f"{x.dtype.name}.")
    if before == "square":
        x = x * x
    if before == "local":
        # Each replica keeps its own block of its own operand: Graphcore's
        # poplar plugin describes LOCAL as the dynamic slice at the replica's
        # index times the block size (here its position in its group).
        from keras_ipu.ops.replication_ops import replication_index

        block = -(-x.shape[0] // k)
        padded = tf.pad(x, [[0, block * k - x.shape[0]]])
        position = tf.cast(replication_index(), tf.int32) % k
        return tf.slice(padded, [position * block], [block])
    out = replica_collectives.reduce_scatter_blocks(x, k, reduction)
    return out / tf.cast(k, x.dtype) if before == "mean" else out


def reduce_scatter(x, replication_factor, op="COLLECTIVE_OP_ADD", name=None):
    """Reduce the given replicated tensor with the result scattered across
    the replicas. For an input of shape [num_elements] the output has shape
    [ceil(num_elements / replication_factor)]; when replication_factor does
    not divide num_elements the result is zero-padded:

        Input:  Replica0: [x0, y0, z0]
                Replica1: [x1, y1, z1]
        Output: Replica0: [x0 + x1, y0 + y1]
                Replica1: [z0 + z1, 0]

    Args:
      x: the input Tensor or list of Tensors, each of rank 1.
      replication_factor: the number of replicas in each collective group:
        consecutive groups {0..k-1}, {k..2k-1}, ... (k must divide the
        replicas the program runs on, checked when it is compiled).
      op: COLLECTIVE_OP_ADD, _MUL, _MIN, _MAX, _LOGICAL_AND, _LOGICAL_OR
        (booleans), _SQUARE_ADD (sum of squares), _MEAN (the sum over k)
        or _LOCAL (no reduction: each replica's own block).
      name: optional op name.

    Returns:
      A Tensor, or a list of Tensors for a list of more than one.
    """
    import tensorflow as tf

    k = replica_collectives.checked_group_size(replication_factor)
    if op not in _OPS:
        raise ValueError(f"reduce_scatter op={op!r}: use one of {sorted(_OPS)}.")
    flat = tf.nest.flatten(x)
    with tf.name_scope(name or "reduce_scatter"):
        out = [_scattered(t, k, op) for t in flat]
    return out[0] if len(out) == 1 else out
