"""keras_ipu.ops.internal_ops: Graphcore utility operations. (Graphcore's
`tensorflow.python.ipu.ops.internal_ops`, also `keras_ipu.internal_ops`)."""

from keras_ipu._unavailable import unavailable_class
from keras_ipu._unavailable import unavailable_function

_PLANNED = "not implemented yet (issue 12)."

fifo = unavailable_function("internal_ops.fifo", _PLANNED)
get_current_iteration_counter = unavailable_function("internal_ops.get_current_iteration_counter", _PLANNED)
print_tensor = unavailable_function("internal_ops.print_tensor", _PLANNED)
remap = unavailable_function("internal_ops.remap", _PLANNED)
remap_deduce = unavailable_function("internal_ops.remap_deduce", _PLANNED)
