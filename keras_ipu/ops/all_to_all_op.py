"""keras_ipu.ops.all_to_all_op: Popops all-to-all and all-gather operators across replicas. (Graphcore's
`tensorflow.python.ipu.ops.all_to_all_op`, also `keras_ipu.all_to_all_op`)."""

from keras_ipu._unavailable import unavailable_class
from keras_ipu._unavailable import unavailable_function

_PLANNED = "not implemented yet (issue 12)."

all_gather = unavailable_function("all_to_all_op.all_gather", _PLANNED)
all_to_all = unavailable_function("all_to_all_op.all_to_all", _PLANNED)
