"""keras_ipu.ops.functional_ops: Functional operators. (Graphcore's
`tensorflow.python.ipu.ops.functional_ops`, also `keras_ipu.functional_ops`)."""


def outlined_function(func=None, unique_sharding=False, keep_input_layouts=None, name=None):
    """Decorator: `func` as one TensorFlow function body that every call
    reuses (Graphcore outlines it into one Poplar function to save code).

    Each call is a call of the same concrete `tf.function` (per input
    signature), which XLA compiles as a called computation: the values are
    `func`'s. `unique_sharding` and `keep_input_layouts` steer Poplar's
    placement and tile layouts of the arguments, which the simulator of
    TensorFlow programs does not model; they are accepted and have no
    effect on the values."""
    del unique_sharding, keep_input_layouts
    name = name or "function"

    def decorated(inner_func):
        import tensorflow as tf

        body = tf.function(inner_func, autograph=False)

        def func_wrapper(*args):
            with tf.name_scope(name):
                return body(*args)

        func_wrapper.__name__ = getattr(inner_func, "__name__", name)
        func_wrapper.__doc__ = getattr(inner_func, "__doc__", None)
        return func_wrapper

    if func is not None:
        return decorated(func)
    return decorated
