"""keras_ipu.ops.rand_ops: Poprand operators. (Graphcore's
`tensorflow.python.ipu.ops.rand_ops`, also `keras_ipu.rand_ops`)."""


def dropout(x, seed=None, rate=0.5, seed_modifier=1, noise_shape=None, name=None):
    """Zero each element of `x` with probability `rate` and scale the kept
    ones by 1 / (1 - rate), so the expected sum is unchanged.

    `seed` (two integers) makes the mask a function of the seed: the same
    seed and `seed_modifier` give the same mask in every run (the modifier
    is folded into the seed, as Poplar modifies its seed with it); without a
    seed each run draws a new mask. `noise_shape` broadcasts one draw over
    the dimensions where it is 1 (each other dimension must equal x's)."""
    import tensorflow as tf

    if rate >= 1.0 or rate < 0.0:
        raise ValueError("The rate must be in the range [0, 1), but was %s" % rate)
    with tf.name_scope(name or "dropout"):
        x = tf.convert_to_tensor(x)
        shape = x.shape.as_list()
        if noise_shape:
            noise_shape = list(noise_shape)
            if len(shape) != len(noise_shape):
                raise ValueError("The length of noise_shape must equal the rank of x.")
            for i, j in zip(shape, noise_shape):
                if j != 1 and i != j:
                    raise ValueError("Dimension mismatch, %d != %d." % (i, j))
        else:
            noise_shape = shape
        if seed is None:
            uniform = tf.random.uniform(noise_shape, dtype=tf.float32)
        else:
            seed = tf.convert_to_tensor(seed)
            if seed.shape != [2]:
                raise ValueError(
                    "Expected the seed to have a shape [2], but got %s." % str(seed.shape))
            seed = tf.random.experimental.stateless_fold_in(
                tf.cast(seed, tf.int32), int(seed_modifier))
            uniform = tf.random.stateless_uniform(noise_shape, seed, dtype=tf.float32)
        keep = tf.cast(uniform >= rate, x.dtype)
        return x * keep * tf.cast(1.0 / (1.0 - rate), x.dtype)
