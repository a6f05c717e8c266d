"""keras_ipu.ops.image_ops: Image operations. (Graphcore's
`tensorflow.python.ipu.ops.image_ops`, also `keras_ipu.image_ops`)."""


def normalise_image(image, channel_offsets, channel_scales, scale=1, name=None):
    """(image[c] * scale - channel_offsets[c]) * channel_scales[c] for the 3
    channels, padded with a zero 4th channel: an [X, Y, Z, 4] tensor of the
    image's type (float16 for uint8 images)."""
    import tensorflow as tf

    with tf.name_scope(name or "normalise_image"):
        image = tf.convert_to_tensor(image)
        if image.shape.rank is None or image.shape[-1] != 3:
            raise ValueError(
                f"normalise_image takes images with 3 channels innermost, got shape "
                f"{image.shape}.")
        dtype = tf.float16 if image.dtype == tf.uint8 else image.dtype
        x = tf.cast(image, dtype) * tf.cast(scale, dtype)
        x = (x - tf.cast(channel_offsets, dtype)) * tf.cast(channel_scales, dtype)
        return tf.pad(x, [[0, 0]] * (image.shape.rank - 1) + [[0, 1]])
