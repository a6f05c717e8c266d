"""keras_ipu.ops.cross_replica_ops: Popops cross-replica operators. (Graphcore's
`tensorflow.python.ipu.ops.cross_replica_ops`, also `keras_ipu.cross_replica_ops`)."""

from keras_ipu._unavailable import unavailable_class
from keras_ipu._unavailable import unavailable_function

_PLANNED = "not implemented yet (issue 12)."

assume_equal_across_replicas = unavailable_function("cross_replica_ops.assume_equal_across_replicas", _PLANNED)
cross_replica_mean = unavailable_function("cross_replica_ops.cross_replica_mean", _PLANNED)
cross_replica_sum = unavailable_function("cross_replica_ops.cross_replica_sum", _PLANNED)
