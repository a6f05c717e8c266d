"""tensorflow.python.ipu.ipu_compiler: compile TensorFlow computations for
the IPU.

`compile(computation, inputs)` runs `computation(*inputs)` as one program
on the simulated IPU, through XLA (keras_ipu/frontends/tensorflow): called
eagerly it compiles and runs now; called while a function is being compiled
for the IPU (inside the function given to IPUStrategy.run) it is part of
that program.
"""

import weakref

_eager = weakref.WeakKeyDictionary()


def _postprocess(outputs):
    """xla.compile's output conventions: a single value comes back in a
    list; operations (which run anyway) are dropped after the tensors;
    nothing but operations, or None, gives None."""
    import tensorflow as tf

    if outputs is None or isinstance(outputs, tf.Operation):
        return None
    if isinstance(outputs, (list, tuple)):
        items = list(outputs)
        tensors = [o for o in items if not isinstance(o, tf.Operation)]
        if items != tensors + [o for o in items if isinstance(o, tf.Operation)]:
            raise ValueError(
                "computation must return zero or more Tensor values followed by "
                "zero or more Operations.")
        return tensors or None
    if isinstance(outputs, dict):
        return outputs
    return [outputs]


def compile(computation, inputs=None):  # noqa: A001 - Graphcore's name
    """Compiles and runs `computation` with the IPU XLA backend.

    Args:
      computation: a Python function building the computation; it takes
        len(inputs) arguments and may return tensors followed by operations.
      inputs: a list of inputs (nested structures of values convertible to
        tensors), or None.

    Returns:
      The tensors `computation` returns, in a list (see xla.compile: a single
      value in a list; None when only operations are returned).

    Raises:
      Exception: if called in a TensorFlow graph that is not being compiled
        for the IPU.
    """
    import tensorflow as tf

    from keras_ipu.frontends.tensorflow.function import bridge
    from keras_ipu.frontends.tensorflow.function import tracing_for_ipu

    inputs = [] if inputs is None else list(inputs)
    if tracing_for_ipu():
        return _postprocess(computation(*inputs))
    if not tf.executing_eagerly():
        raise Exception(
            "A computation has been compiled, however it was not placed on an IPU "
            "device. This computation will not be executed on an IPU.\n"
            "ipu_compiler.compile was called inside a TensorFlow function that is "
            "not being compiled for the IPU: run that function with "
            "`strategy.run(fn, args)` of an IPUStrategy, or call "
            "ipu_compiler.compile eagerly.")
    runner = _eager.get(computation)
    if runner is None:
        def run(args):
            return _postprocess(computation(*args))

        run.__name__ = getattr(computation, "__name__", "computation")
        runner = bridge(tf.function(run, jit_compile=True, autograph=False))
        _eager[computation] = runner
    return runner(inputs)
