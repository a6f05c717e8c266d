"""keras_ipu.ops.rand_ops: Poprand operators. (Graphcore's
`tensorflow.python.ipu.ops.rand_ops`, also `keras_ipu.rand_ops`)."""

from keras_ipu._unavailable import unavailable_class
from keras_ipu._unavailable import unavailable_function

_PLANNED = "not implemented yet (issue 12)."

dropout = unavailable_function("rand_ops.dropout", _PLANNED)
