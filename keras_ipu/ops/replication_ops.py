"""keras_ipu.ops.replication_ops: Operations to be used in replicated mode. (Graphcore's
`tensorflow.python.ipu.ops.replication_ops`, also `keras_ipu.replication_ops`)."""

from keras_ipu._unavailable import unavailable_class
from keras_ipu._unavailable import unavailable_function

_PLANNED = "not implemented yet (issue 12)."

replication_index = unavailable_function("replication_ops.replication_index", _PLANNED)
