"""keras_ipu.ops.math_ops: IPU specific maths operations. (Graphcore's
`tensorflow.python.ipu.ops.math_ops`, also `keras_ipu.math_ops`)."""

from keras_ipu._unavailable import unavailable_class
from keras_ipu._unavailable import unavailable_function

_PLANNED = "not implemented yet (issue 12)."

segment_sum = unavailable_function("math_ops.segment_sum", _PLANNED)
serialized_matmul = unavailable_function("math_ops.serialized_matmul", _PLANNED)
