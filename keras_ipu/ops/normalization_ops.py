"""keras_ipu.ops.normalization_ops: Popnn normalization operators. (Graphcore's
`tensorflow.python.ipu.ops.normalization_ops`, also `keras_ipu.normalization_ops`).

TF1-style functions (their beta and gamma are `tf.compat.v1.get_variable`s
in a variable scope, as in an estimator's model_fn). The statistics are
Popnn's: per example, over the spatial dimensions and the channels of each
group, where channel c belongs to group c % groups (PopLibs' strided
grouping, the default of keras_ipu.layers.GroupNormalization too); layer
norm is one group, instance norm one channel per group. `training` does not
change the values: Popnn's inference path normalises with the statistics
of the same batch.
"""


def _normalize(inputs, groups, channels_axis, center, scale, epsilon, param_initializers,
               reuse, variables_collections, trainable, scope, default_scope):
    import tensorflow as tf

    inputs = tf.convert_to_tensor(inputs)
    rank = inputs.shape.rank
    if rank is None:
        raise ValueError("Inputs %s has undefined rank." % inputs.name)
    if channels_axis > rank - 1:
        raise ValueError("Axis is out of bounds.")
    if channels_axis < 0:
        channels_axis += rank
    if channels_axis not in (1, rank - 1):
        raise ValueError("Unsupported data format, group norm only supports NCHW"
                         "(channel axis 1) and NHWC (channel axis -1).")
    channels = inputs.shape[channels_axis]
    if channels is None:
        raise ValueError("Inputs %s has undefined channel dimension: %d." %
                         (inputs.name, channels_axis))
    groups = channels if groups is None else groups
    if groups > channels:
        raise ValueError("Invalid groups %d for %d channels." % (groups, channels))
    if channels % groups != 0:
        raise ValueError("%d channels is not commensurate with %d groups." % (channels, groups))

    initializers = param_initializers or {}

    def parameter(name, initializer, enabled, constant):
        if not enabled:
            return tf.constant(constant, inputs.dtype, [channels])
        collections = variables_collections
        if isinstance(collections, dict):
            collections = collections.get(name)
        return tf.compat.v1.get_variable(
            name, shape=[channels], dtype=inputs.dtype,
            initializer=initializers.get(name, initializer),
            collections=collections, trainable=trainable)

    with tf.compat.v1.variable_scope(scope, default_scope, [inputs], reuse=reuse):
        beta = parameter("beta", tf.compat.v1.zeros_initializer(), center, 0.0)
        gamma = parameter("gamma", tf.compat.v1.ones_initializer(), scale, 1.0)
        x = inputs if channels_axis == rank - 1 else tf.experimental.numpy.moveaxis(inputs, 1, -1)
        channels_last_shape = tf.shape(x)
        # [batch, rest..., channels/groups, groups]: the last axis is the group.
        grouped = tf.reshape(x, tf.concat([tf.shape(x)[:1], [-1, channels // groups, groups]], 0))
        grouped32 = tf.cast(grouped, tf.float32)
        mean, variance = tf.nn.moments(grouped32, axes=[1, 2], keepdims=True)
        normalized = (grouped32 - mean) * tf.math.rsqrt(variance + epsilon)
        out = tf.reshape(tf.cast(normalized, inputs.dtype), channels_last_shape)
        out = out * gamma + beta
        if channels_axis != rank - 1:
            out = tf.experimental.numpy.moveaxis(out, -1, 1)
        return out


def group_norm(inputs, groups=2, channels_axis=-1, reduction_axes=None, center=True,
               scale=True, epsilon=1e-6, param_initializers=None, reuse=None,
               variables_collections=None, training=True, trainable=True, scope=None):
    """Group normalization (Wu and He, 2018) of `inputs` with `groups`
    groups of channels (see the module doc); beta and gamma per channel.
    `reduction_axes` is deprecated by Graphcore and ignored."""
    del reduction_axes, training
    return _normalize(inputs, groups, channels_axis, center, scale, epsilon,
                      param_initializers, reuse, variables_collections, trainable, scope,
                      "GroupNorm")


def layer_norm(inputs, channels_axis=-1, reduction_axes=None, center=True, scale=True,
               epsilon=1e-6, param_initializers=None, reuse=None, variables_collections=None,
               training=True, trainable=True, scope=None):
    """Layer normalization: group normalization with one group."""
    del reduction_axes, training
    return _normalize(inputs, 1, channels_axis, center, scale, epsilon, param_initializers,
                      reuse, variables_collections, trainable, scope, "LayerNorm")


def instance_norm(inputs, channels_axis=-1, reduction_axes=None, center=True, scale=True,
                  epsilon=1e-6, param_initializers=None, reuse=None, variables_collections=None,
                  training=True, trainable=True, scope=None):
    """Instance normalization: group normalization with one channel per group."""
    del reduction_axes, training
    return _normalize(inputs, None, channels_axis, center, scale, epsilon, param_initializers,
                      reuse, variables_collections, trainable, scope, "InstanceNorm")
