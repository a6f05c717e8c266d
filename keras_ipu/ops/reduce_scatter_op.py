"""keras_ipu.ops.reduce_scatter_op: Popops reduce-scatter operator. (Graphcore's
`tensorflow.python.ipu.ops.reduce_scatter_op`, also `keras_ipu.reduce_scatter_op`)."""

from keras_ipu._unavailable import unavailable_class
from keras_ipu._unavailable import unavailable_function

_PLANNED = "not implemented yet (issue 12)."

reduce_scatter = unavailable_function("reduce_scatter_op.reduce_scatter", _PLANNED)
