"""keras_ipu.ops.within_replica_ops: Popops within-replica operators. (Graphcore's
`tensorflow.python.ipu.ops.within_replica_ops`, also `keras_ipu.within_replica_ops`).

Collectives between the shards (IPUs) of one replica: `input_shards[i]` is
the tensor on shard i. They need no other replica, so they are ordinary
TensorFlow operations here: the values are Graphcore's; they are compiled
like the program's other operations (scopes.ipu_shard says where a
sharded program's operations run), not as a collective over the
IPU-Links, so Poplar's exchange pattern between the shards is not costed.
"""

from keras_ipu._unavailable import declare_unavailable

declare_unavailable(
    globals(), "within_replica_ops",
    "which shard gets which reduced chunk is Poplar's choice and is not "
    "defined: the reference's only example (3 elements, 4 shards) gives shard "
    "0 the padding, shards 1 and 2 their own chunks and shard 3 the first, "
    "which no rule for other sizes follows from, and Graphcore's "
    "within_replica_ops tests compare the shards' results as an unordered "
    "collection (assertCountEqual); use all_reduce and slice each shard's part.",
    functions=("reduce_scatter",),
)

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


def all_reduce(input_shards, op):
    """Every shard gets the elementwise `op` over the shards' rank-0 or
    rank-1 tensors, each zero-padded to the longest: a tuple, element i
    for shard i. `op`: COLLECTIVE_OP_ADD / MUL / MIN / MAX / LOGICAL_AND /
    LOGICAL_OR."""
    import functools

    import tensorflow as tf

    shards = _validated(input_shards)
    if op not in _REDUCTIONS:
        raise ValueError(
            f"within_replica_ops.all_reduce op={op!r}: use one of {sorted(_REDUCTIONS)} "
            "(COLLECTIVE_OP_LOCAL is not supported: it reduces nothing across shards).")
    if any(s.shape.rank > 1 for s in shards):
        raise ValueError("within_replica_ops.all_reduce takes tensors of rank 0 or 1.")
    flat = [tf.reshape(s, [-1]) for s in shards]
    longest = max(f.shape[0] for f in flat)
    padded = [tf.pad(f, [[0, longest - f.shape[0]]]) for f in flat]
    name = _REDUCTIONS[op]
    if name == "add_n":
        reduced = tf.add_n(padded)
    else:
        fn = getattr(tf.math, name)
        reduced = functools.reduce(fn, padded)
    return tuple(tf.identity(reduced) for _ in shards)


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
