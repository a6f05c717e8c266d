"""keras_ipu.ops.within_replica_ops: Popops within-replica operators. (Graphcore's
`tensorflow.python.ipu.ops.within_replica_ops`, also `keras_ipu.within_replica_ops`)."""

from keras_ipu._unavailable import unavailable_class
from keras_ipu._unavailable import unavailable_function

_PLANNED = "not implemented yet (issue 12)."

all_gather = unavailable_function("within_replica_ops.all_gather", _PLANNED)
all_reduce = unavailable_function("within_replica_ops.all_reduce", _PLANNED)
reduce_scatter = unavailable_function("within_replica_ops.reduce_scatter", _PLANNED)
