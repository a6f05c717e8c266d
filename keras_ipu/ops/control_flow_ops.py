"""keras_ipu.ops.control_flow_ops: Control flow operations. (Graphcore's
`tensorflow.python.ipu.ops.control_flow_ops`, also `keras_ipu.control_flow_ops`)."""

from keras_ipu._unavailable import unavailable_class
from keras_ipu._unavailable import unavailable_function

_PLANNED = "not implemented yet (issue 12)."

barrier = unavailable_function("control_flow_ops.barrier", _PLANNED)
