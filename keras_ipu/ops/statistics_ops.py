"""keras_ipu.ops.statistics_ops: Statistics operators. (Graphcore's
`tensorflow.python.ipu.ops.statistics_ops`, also `keras_ipu.statistics_ops`).

A histogram over n levels has n + 1 bins, as PopLibs' popops::histogram:
bin 0 counts the values below levels[0], bin i the values in
[levels[i-1], levels[i]), bin n those at or above levels[n-1]. The counts
are float32.
"""


def _float_operands(what, *tensors):
    import tensorflow as tf

    tensors = [tf.convert_to_tensor(t) for t in tensors]
    if any(t.dtype not in (tf.float16, tf.float32) for t in tensors):
        raise ValueError(f"Only float16 and float32 types are supported for {what}.")
    if any(t.shape.rank != 1 for t in tensors):
        raise ValueError(f"{what.replace(' computation', '').replace(' ', '_')} expects "
                         "rank-1 tensor inputs.")
    return tensors


def fixed_width_bins(inputs, n_bins):
    """`n_bins` evenly spaced levels from the minimum to the maximum of
    `inputs` (both included)."""
    import tensorflow as tf

    inputs = tf.convert_to_tensor(inputs)
    return tf.linspace(tf.reduce_min(inputs), tf.reduce_max(inputs), n_bins)


def histogram_normalize(hist):
    """`hist` divided by its total."""
    import tensorflow as tf

    return hist / tf.reduce_sum(hist, axis=0)


def _counts(inputs, levels, absolute_of_input):
    import tensorflow as tf

    x = tf.cast(inputs, tf.float32)
    if absolute_of_input:
        x = tf.abs(x)
    levels = tf.cast(levels, tf.float32)
    # below[j]: how many values lie below levels[j]; the bins are the
    # differences of 0, below..., and the total.
    below = tf.reduce_sum(tf.cast(x[:, None] < levels[None, :], tf.float32), axis=0)
    total = tf.cast(tf.size(x), tf.float32)[None]
    edges = tf.concat([tf.zeros([1], tf.float32), below, total], 0)
    return edges[1:] - edges[:-1]


def histogram(inputs, levels, absolute_of_input=False):
    """The histogram of `inputs` over the bins `levels` delimit (see the
    module doc): a float32 tensor of len(levels) + 1 counts."""
    inputs, levels = _float_operands("histogram computation", inputs, levels)
    return _counts(inputs, levels, absolute_of_input)


def histogram_update(hist, inputs, levels, absolute_of_input=False):
    """`hist` (float32, len(levels) + 1 counts) plus the histogram of
    `inputs` over `levels`."""
    import tensorflow as tf

    hist = tf.convert_to_tensor(hist)
    if hist.dtype != tf.float32:
        raise ValueError("hist must be of float32 type")
    hist, inputs, levels = _float_operands("histogram update", hist, inputs, levels)
    if hist.shape[0] != levels.shape[0] + 1:
        raise ValueError("hist and levels shapes are incompatible. "
                         "For n levels, hist must have n+1 elements.")
    return hist + _counts(inputs, levels, absolute_of_input)
