"""keras_ipu.ops.within_replica_ops: Popops within-replica operators. (Graphcore's
`tensorflow.python.ipu.ops.within_replica_ops`, also `keras_ipu.within_replica_ops`).

Collectives between the shards (IPUs) of one replica: `input_shards[i]` is
the tensor on shard i. They need no other replica, so they are ordinary
TensorFlow operations here: the values are Graphcore's; they are compiled
like the program's other operations (scopes.ipu_shard says where a
sharded program's operations run), not as a collective over the
IPU-Links, so Poplar's exchange pattern between the shards is not costed.

reduce_scatter's placement of the reduced elements is GCL's
(gcl::reduceScatterWithinReplica, closed source): Graphcore's own
plugin says it does not know how GCL distributes them and pads every
shard's result to ceil(n / shards) elements, and Graphcore's tests
check the shards' results as an unordered collection against a model
of the op (`reduce` in within_replica_ops_test.py) that deals the
reduced elements out from the last, one per shard in turn. That model
is the one statement of the result in Graphcore's source, so it is the
order here: shard s holds elements n-1-s, n-1-s-k, ... (k shards),
zeros after them. The reference's 3-element example shows the same
collection of chunks in another placement.
"""

_REDUCTIONS = {
    "COLLECTIVE_OP_ADD": "add_n",
    "COLLECTIVE_OP_MUL": "multiply",
    "COLLECTIVE_OP_MIN": "minimum",
    "COLLECTIVE_OP_MAX": "maximum",
    "COLLECTIVE_OP_LOGICAL_AND": "logical_and",
    "COLLECTIVE_OP_LOGICAL_OR": "logical_or",
}


def _validated(input_shards):
    import tensorflow as tf

    shards = [tf.convert_to_tensor(s) for s in input_shards]
    if len({s.ref() for s in shards}) != len(shards):
        raise ValueError("input_shards should not contain any duplicate entries.")
    if len({s.dtype for s in shards}) != 1:
        raise ValueError("Expected tensors to all be of the same type.")
    if len({s.shape.rank for s in shards}) != 1:
        raise ValueError("Expected tensors to all be of the same rank.")
    return shards


def _reduced(input_shards, op, name):
    """The elementwise `op` over the shards' rank-0 or rank-1 tensors, each
    zero-padded to the longest (a rank-1 tensor), and the shard count."""
    import functools

    import tensorflow as tf

    shards = _validated(input_shards)
    if op not in _REDUCTIONS:
        raise ValueError(
            f"within_replica_ops.{name} op={op!r}: use one of {sorted(_REDUCTIONS)} "
            "(COLLECTIVE_OP_LOCAL is not supported: it reduces nothing across shards).")
    if any(s.shape.rank > 1 for s in shards):
        raise ValueError(f"within_replica_ops.{name} takes tensors of rank 0 or 1.")
    flat = [tf.reshape(s, [-1]) for s in shards]
    longest = max(f.shape[0] for f in flat)
    padded = [tf.pad(f, [[0, longest - f.shape[0]]]) for f in flat]
    reduction = _REDUCTIONS[op]
    if reduction == "add_n":
        return tf.add_n(padded), len(shards)
    return functools.reduce(getattr(tf.math, reduction), padded), len(shards)


def all_reduce(input_shards, op):
    """Every shard gets the elementwise `op` over the shards' rank-0 or
    rank-1 tensors, each zero-padded to the longest: a tuple, element i
    for shard i. `op`: COLLECTIVE_OP_ADD / MUL / MIN / MAX / LOGICAL_AND /
    LOGICAL_OR."""
    import tensorflow as tf

    reduced, count = _reduced(input_shards, op, "all_reduce")
    return tuple(tf.identity(reduced) for _ in range(count))


def reduce_scatter(input_shards, op):
    """The elementwise `op` over the shards' rank-0 or rank-1 tensors (each
    zero-padded to the longest, n elements) scattered over the k shards:
    a tuple, element s for shard s, each of ceil(n / k) elements: shard s
    holds reduced elements n-1-s, n-1-s-k, ..., then zeros (the order of
    Graphcore's tests, see the module doc). The gradient is TensorFlow's
    own of these operations: each shard's input gets the gradients of the
    elements it reduced into."""
    import math

    import tensorflow as tf

    reduced, count = _reduced(input_shards, op, "reduce_scatter")
    n = reduced.shape[0]
    size = math.ceil(n / count)
    # Index n reads the zero appended for the padding.
    table = tf.concat([reduced, tf.zeros([1], reduced.dtype)], axis=0)
    picks = [[n - 1 - s - j * count if n - 1 - s - j * count >= 0 else n
              for j in range(size)] for s in range(count)]
    return tuple(tf.gather(table, indices) for indices in picks)


def all_gather(input_shards, axis=0):
    """Every shard gets the shards' tensors concatenated along `axis` (their
    other dimensions must agree): a tuple, element i for shard i."""
    import tensorflow as tf

    shards = _validated(input_shards)
    if shards[0].shape.rank == 0:
        gathered = tf.stack(shards)
    else:
        first = shards[0].shape.as_list()
        for i, s in enumerate(shards[1:]):
            other = s.shape.as_list()
            if first[:axis] != other[:axis] or first[axis + 1:] != other[axis + 1:]:
                raise ValueError(
                    "Expecting tensor dimensions to all have the same sizes, except for "
                    f"dim {axis}, but got shapes {first} and {other} for tensors 0 and {i + 1}")
        gathered = tf.concat(shards, axis=axis)
    return tuple(tf.identity(gathered) for _ in shards)
