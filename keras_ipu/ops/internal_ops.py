"""keras_ipu.ops.internal_ops: Graphcore utility operations. (Graphcore's
`tensorflow.python.ipu.ops.internal_ops`, also `keras_ipu.internal_ops`)."""

from keras_ipu._unavailable import PLANNED
from keras_ipu._unavailable import declare_unavailable

declare_unavailable(
    globals(), "internal_ops", PLANNED,
    functions=("fifo", "get_current_iteration_counter", "print_tensor", "remap", "remap_deduce"),
)
