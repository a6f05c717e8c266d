"""keras_ipu.ops.internal_ops: Graphcore utility operations. (Graphcore's
`tensorflow.python.ipu.ops.internal_ops`, also `keras_ipu.internal_ops`)."""

import logging

from keras_ipu._unavailable import unavailable_function

logger = logging.getLogger("keras_ipu")

get_current_iteration_counter = unavailable_function(
    "internal_ops.get_current_iteration_counter",
    "the counter is the one Poplar keeps for the enclosing loops.repeat or "
    "pipeline; the loops the TensorFlow front end imports are XLA while loops "
    "whose counter is not exposed to the body; carry a counter in the loop's "
    "inputs instead.")

_FIFO = (
    "a FIFO of depth >= 1 keeps values between iterations of the enclosing "
    "device loop (Poplar's internal pipelining op); the TensorFlow front end "
    "has no state carried between loop iterations outside the loop's own "
    "variables."
)


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


def fifo(x, depth, name=None):
    """`x` delayed by `depth` iterations. Depth < 1 is `x` itself, as
    Graphcore's; a deeper FIFO raises NotImplementedError (see _FIFO)."""
    del name
    if depth < 1:
        return x
    raise NotImplementedError(f"internal_ops.fifo(depth={depth}) is not available in "
                              f"keras_ipu: {_FIFO}")
