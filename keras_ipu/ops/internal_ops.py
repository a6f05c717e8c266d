"""keras_ipu.ops.internal_ops: Graphcore utility operations. (Graphcore's
`tensorflow.python.ipu.ops.internal_ops`, also `keras_ipu.internal_ops`)."""

import logging

logger = logging.getLogger("keras_ipu")


def get_current_iteration_counter(name=None, **kwargs):
    """Returns which iteration of the enclosing loop the op runs in (int32
    scalar): in a pipeline's stage the gradient accumulation iteration
    (0..G-1), in loops.repeat or a tf.range loop its iteration, 0 outside
    any loop (ops/loop_state.py). Graphcore's `lower_into_pipeline_stage`
    keyword only chooses where Poplar computes it, which changes no value."""
    import tensorflow as tf

    from keras_ipu.ops import loop_state

    unknown = set(kwargs) - {"lower_into_pipeline_stage"}
    if unknown:
        raise TypeError(f"get_current_iteration_counter got unexpected keyword "
                        f"arguments {sorted(unknown)}.")
    with tf.name_scope(name or "execution_counter"):
        return loop_state.iteration_counter()


def print_tensor(input, name=""):  # noqa: A002 (Graphcore's argument name)
    """Print the specified input.

    Returns an op (a tensor with the input's value) that prints the input
    to the standard error each time the compiled program runs it, as
    "name: [values]". Graphcore's usage (return the op, or make it a
    control dependency) works; in a TensorFlow 2 function an op nothing
    uses prints too, since XLA keeps a call with a side effect. The tensor
    goes to the host over a data stream (ops/tensor_printing.py)."""
    from keras_ipu.ops import tensor_printing

    return tensor_printing.print_tensor(input, name or "")


def remap(x, name=None):
    """A copy of `x` laid out linearly over the IPU's tiles. The tile
    layout is Poplar's; the simulator of TensorFlow programs does not model
    tile layouts, so the copy has `x`'s values."""
    import tensorflow as tf

    logger.warning("remap is a Graphcore internal op")
    return tf.identity(x, name=name)


def remap_deduce(x, name=None):
    """A copy of `x` whose tile layout Poplar deduces from its users (see
    remap: the values are `x`'s)."""
    import tensorflow as tf

    return tf.identity(x, name=name)


def fifo(x, depth, offload=False, name=None):
    """Introduces a first-in-first-out queue with a fixed depth: returns `x`
    of `depth` runs before (zeros in the first `depth` runs, where Graphcore
    says unspecified); depth < 1 is `x` itself, as Graphcore's. No gradient
    flows through it, as Graphcore's. With `offload` Poplar keeps the queue
    in Streaming Memory: the values are the same; here the queue is a
    buffer in the IPU's memory either way (ops/loop_state.py)."""
    import tensorflow as tf

    from keras_ipu.ops import loop_state

    del offload
    if depth < 1:
        return x
    with tf.name_scope(name or "fifo"):
        return loop_state.fifo(x, int(depth))
