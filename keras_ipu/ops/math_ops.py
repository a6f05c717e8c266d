"""keras_ipu.ops.math_ops: IPU specific maths operations. (Graphcore's
`tensorflow.python.ipu.ops.math_ops`, also `keras_ipu.math_ops`)."""

def checked_serialization_factor(value):
    """Graphcore's `serialization_factor` (of serialized products and
    lookups) as an int, at least 1."""
    value = int(value)
    if value < 1:
        raise ValueError(f"serialization_factor has to be at least 1, but was {value}.")
    return value


def _slices(x, axis, factor, what):
    """`x` cut into `factor` equal slices along `axis` (Graphcore's checks)."""
    import tensorflow as tf

    size = x.shape[axis]
    if size % factor:
        raise ValueError(
            f"Expected 'serialization_factor' ({factor}) to divide the {what} ({size}).")
    return tf.split(x, factor, axis=axis)


def serialized_matmul(a, b, serialization_factor, serialization_dimension,
                      transpose_a=False, transpose_b=False, name=None):
    """a @ b computed as `serialization_factor` smaller products along one
    dimension (Graphcore's, which saves code size on the IPU):
    "a_columns" splits a's m rows of the result, "a_rows_b_columns" the
    contracted k (the partial products are summed), "b_rows" the n
    columns of the result. The backward pass of the slices is serialized
    the same way (TensorFlow differentiates each small product)."""
    import tensorflow as tf

    serialization_factor = checked_serialization_factor(serialization_factor)
    with tf.name_scope(name or "serialized_matmul"):
        a = tf.convert_to_tensor(a)
        b = tf.convert_to_tensor(b)
        if a.shape.rank < 2:
            raise ValueError("Expected tensor 'a' to have a minimum rank of 2")
        if b.shape.rank < 2:
            raise ValueError("Expected tensor 'b' to have a minimum rank of 2")
        # The axes of m (in a), k (in a and b) and n (in b), transposes included.
        a_m, a_k = (a.shape.rank - 1, a.shape.rank - 2) if transpose_a else (a.shape.rank - 2, a.shape.rank - 1)
        b_k, b_n = (b.shape.rank - 1, b.shape.rank - 2) if transpose_b else (b.shape.rank - 2, b.shape.rank - 1)

        def product(x, y):
            return tf.linalg.matmul(x, y, transpose_a=transpose_a, transpose_b=transpose_b)

        factor = serialization_factor
        if serialization_dimension == "a_columns":
            parts = [product(p, b) for p in _slices(a, a_m, factor, "columns dimension of 'a'")]
            return tf.concat(parts, axis=-2)
        if serialization_dimension == "a_rows_b_columns":
            if a.shape[a_k] != b.shape[b_k]:
                raise ValueError(
                    f"Expected the number of columns in 'a' ({a.shape[a_k]}) to match the "
                    f"number of rows in 'b' ({b.shape[b_k]}).")
            pairs = zip(_slices(a, a_k, factor, "rows dimension of 'a'"),
                        _slices(b, b_k, factor, "rows dimension of 'a'"))
            return tf.add_n([product(x, y) for x, y in pairs])
        if serialization_dimension == "b_rows":
            parts = [product(a, p) for p in _slices(b, b_n, factor, "rows dimension of 'b'")]
            return tf.concat(parts, axis=-1)
        raise ValueError(
            f"Invalid serialization_dimension={serialization_dimension}, expected one of: "
            "'a_columns', 'a_rows_b_columns', 'b_rows'.")


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
