"""keras_ipu.ops.functional_ops: Functional operators. (Graphcore's
`tensorflow.python.ipu.ops.functional_ops`, also `keras_ipu.functional_ops`)."""

from keras_ipu._unavailable import unavailable_class
from keras_ipu._unavailable import unavailable_function

_PLANNED = "not implemented yet (issue 12)."

outlined_function = unavailable_function("functional_ops.outlined_function", _PLANNED)
