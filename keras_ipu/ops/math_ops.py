"""keras_ipu.ops.math_ops: IPU specific maths operations. (Graphcore's
`tensorflow.python.ipu.ops.math_ops`, also `keras_ipu.math_ops`)."""

from keras_ipu._unavailable import unavailable_class
from keras_ipu._unavailable import unavailable_function

_PLANNED = "not implemented yet (issue 12)."

serialized_matmul = unavailable_function("math_ops.serialized_matmul", _PLANNED)


def segment_sum(data, segment_ids, num_segments, name=None):
    """The sum of the rows of `data` in each segment (rows j with
    segment_ids[j] == i sum into output[i]; an empty segment is 0)."""
    import tensorflow as tf

    with tf.name_scope(name or "segment_sum"):
        data = tf.convert_to_tensor(data)
        segment_ids = tf.convert_to_tensor(segment_ids)
        if data.shape.rank is None or segment_ids.shape.rank is None:
            raise ValueError("The rank of data and segment_ids must be fully defined.")
        if data.shape.rank < 1:
            raise ValueError("data must have at least rank 1.")
        if segment_ids.shape.rank != 1:
            raise ValueError("segment_ids must have rank 1.")
        if data.shape[0] != segment_ids.shape[0]:
            raise ValueError(
                f"The length of the 0th dimension of data ({data.shape[0]}) and "
                f"segment_ids ({segment_ids.shape[0]}) must be equal.")
        return tf.math.unsorted_segment_sum(data, segment_ids, num_segments)
