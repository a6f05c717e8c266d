"""keras_ipu.ops.slicing_ops: Slicing operators. (Graphcore's
`tensorflow.python.ipu.ops.slicing_ops`, also `keras_ipu.slicing_ops`).

A sequence slice copies runs of rows (the outermost dimension): run i is
num_elems[i] rows from src_offsets[i] in the source to dst_offsets[i] in
the destination. The offsets may be tensors: each destination row finds
the run that writes it (the last one, where runs overlap) and gathers its
source row, so the program's shapes stay static.
"""


def _check_runs(num_elems, *offsets, names):
    n = num_elems.shape[0]
    if n == 0 or any(o.shape[0] != n for o in offsets):
        raise ValueError(f"{names} must have matching, nonzero shapes of rank 1.")


def _exclusive_cumsum(num_elems):
    import tensorflow as tf

    return tf.cumsum(num_elems, exclusive=True)


def _slice_rows(dst, src, num_elems, src_offsets, dst_offsets, zero_unused):
    import tensorflow as tf

    rows = tf.range(tf.shape(dst)[0], dtype=num_elems.dtype)[:, None]
    src_offsets = tf.cast(src_offsets, num_elems.dtype)
    dst_offsets = tf.cast(dst_offsets, num_elems.dtype)
    writes = tf.logical_and(rows >= dst_offsets[None, :],
                            rows < (dst_offsets + num_elems)[None, :])
    run = tf.reduce_max(tf.where(writes, tf.range(tf.shape(num_elems)[0],
                                                  dtype=num_elems.dtype)[None, :], -1), axis=1)
    written = run >= 0
    safe_run = tf.maximum(run, 0)
    source_row = tf.gather(src_offsets, safe_run) + rows[:, 0] - tf.gather(dst_offsets, safe_run)
    source_row = tf.clip_by_value(source_row, 0, tf.cast(tf.shape(src)[0] - 1, source_row.dtype))
    copied = tf.gather(src, source_row)
    kept = tf.zeros_like(dst) if zero_unused else dst
    mask = tf.reshape(written, [-1] + [1] * (dst.shape.rank - 1))
    return tf.where(mask, tf.cast(copied, dst.dtype), kept)


def sequence_slice(dst, src, num_elems, src_offsets, dst_offsets, zero_unused):
    """`dst` with run i of `src` (num_elems[i] rows from src_offsets[i])
    written at dst_offsets[i]; rows no run writes are zero when
    `zero_unused`, else dst's."""
    import tensorflow as tf

    dst, src = tf.convert_to_tensor(dst), tf.convert_to_tensor(src)
    num_elems = tf.convert_to_tensor(num_elems)
    src_offsets, dst_offsets = tf.convert_to_tensor(src_offsets), tf.convert_to_tensor(dst_offsets)
    _check_runs(num_elems, src_offsets, dst_offsets,
                names="num_elems, src_offsets and dst_offsets")
    if src.shape[1:] != dst.shape[1:]:
        raise ValueError("src and dst inner shapes must match.")
    return _slice_rows(dst, src, num_elems, src_offsets, dst_offsets, zero_unused)


def sequence_slice_unpack(src, num_elems, src_offsets, total_elements):
    """The runs (num_elems[i] rows of `src` from src_offsets[i]) one after
    another in a tensor of `total_elements` rows (rows past them zero)."""
    import tensorflow as tf

    src = tf.convert_to_tensor(src)
    num_elems, src_offsets = tf.convert_to_tensor(num_elems), tf.convert_to_tensor(src_offsets)
    _check_runs(num_elems, src_offsets, names="num_elems and src_offsets")
    dst = tf.zeros(tf.concat([[total_elements], tf.shape(src)[1:]], 0), src.dtype)
    return _slice_rows(dst, src, num_elems, src_offsets, _exclusive_cumsum(num_elems), True)


def sequence_slice_pack(dst, src, num_elems, dst_offsets, zero_unused):
    """The inverse of sequence_slice_unpack: the consecutive runs of `src`
    written into `dst` at dst_offsets."""
    import tensorflow as tf

    dst, src = tf.convert_to_tensor(dst), tf.convert_to_tensor(src)
    num_elems, dst_offsets = tf.convert_to_tensor(num_elems), tf.convert_to_tensor(dst_offsets)
    _check_runs(num_elems, dst_offsets, names="num_elems and dst_offsets")
    if src.shape[1:] != dst.shape[1:]:
        raise ValueError("src and dst inner shapes must match.")
    return _slice_rows(dst, src, num_elems, _exclusive_cumsum(num_elems), dst_offsets,
                       zero_unused)
