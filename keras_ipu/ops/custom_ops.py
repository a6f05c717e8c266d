"""keras_ipu.ops.custom_ops: Custom operations. (Graphcore's
`tensorflow.python.ipu.ops.custom_ops`, also `keras_ipu.custom_ops`)."""

from keras_ipu._unavailable import unavailable_class
from keras_ipu._unavailable import unavailable_function

_PLANNED = "not implemented yet (issue 12)."

codelet_expression_op = unavailable_function("custom_ops.codelet_expression_op", _PLANNED)
cpu_user_operation = unavailable_function("custom_ops.cpu_user_operation", _PLANNED)
precompiled_user_op = unavailable_function("custom_ops.precompiled_user_op", _PLANNED)
