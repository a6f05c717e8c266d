"""keras_ipu.ops.embedding_ops: Popops embedding operators. (Graphcore's
`tensorflow.python.ipu.ops.embedding_ops`, also `keras_ipu.embedding_ops`)."""

import math

from keras_ipu._unavailable import declare_unavailable
from keras_ipu.ops.math_ops import checked_serialization_factor

_HOST_EMBEDDING = (
    "a host embedding keeps its table in host memory and serves each lookup "
    "and SGD update through a Poplar host-side stream registered with a TF1 "
    "session (sess.run(embedding(iteration_count))); keras_ipu runs TensorFlow 2 "
    "functions through XLA, which has no such stream. Keep the table in a "
    "tf.Variable and use embedding_lookup."
)

declare_unavailable(
    globals(), "embedding_ops", _HOST_EMBEDDING,
    classes=("HostEmbedding", "HostEmbeddingOptimizerSpec", "HostEmbeddingSGDGAOptimizerSpec"),
    functions=("create_host_embedding",),
)


def embedding_lookup(params, ids, name=None, serialization_factor=1,
                     one_hot_threshold=0, min_encoding_size=1216):
    """The rows of `params` at `ids`: a [*ids.shape, *params.shape[1:]]
    tensor (tf.nn.embedding_lookup of one table).

    With `serialization_factor` n > 1 the table is cut into n equal blocks
    of rows and looked up block by block, each lookup masked to the ids in
    its block and the n results summed (Graphcore's serialized lookup,
    which saves memory when the table has other users): the same rows, and
    the gradient of the table is the scatter-add of the incoming gradient
    either way. `one_hot_threshold` and `min_encoding_size` are deprecated
    by Graphcore and ignored."""
    import tensorflow as tf

    del one_hot_threshold, min_encoding_size
    serialization_factor = checked_serialization_factor(serialization_factor)
    with tf.name_scope(name or "embedding_lookup"):
        params = tf.convert_to_tensor(params)
        ids = tf.convert_to_tensor(ids)
        rows = params.shape[0]
        if rows % serialization_factor:
            raise ValueError(
                f"The serialization_factor ({serialization_factor}) must divide the size "
                f"of the 0th dimension of params ({rows}).")
        row_shape = params.shape[1:].as_list()
        table = tf.reshape(params, [rows, math.prod(row_shape)])
        flat_ids = tf.reshape(ids, [-1])
        if serialization_factor == 1:
            out = tf.gather(table, flat_ids)
        else:
            block = rows // serialization_factor
            out = None
            for i in range(serialization_factor):
                low = i * block
                local = flat_ids - low
                inside = tf.logical_and(local >= 0, local < block)
                # Ids outside the block read row 0 of it, then are masked out.
                looked_up = tf.gather(table[low:low + block], tf.where(inside, local, 0))
                looked_up = looked_up * tf.cast(inside, table.dtype)[:, None]
                out = looked_up if out is None else out + looked_up
        return tf.reshape(out, tf.concat([tf.shape(ids), row_shape], 0)
                          if ids.shape.rank is None or not ids.shape.is_fully_defined()
                          else ids.shape.as_list() + row_shape)
