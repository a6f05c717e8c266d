"""keras_ipu.sharding: Graphcore's `tensorflow.python.ipu.sharding`."""

from keras_ipu._unavailable import unavailable_class
from keras_ipu._unavailable import unavailable_function

_PLANNED = "not implemented yet (issue 12)."

dependencies = unavailable_function("sharding.dependencies", _PLANNED)
enable_sharded_gradient_tape = unavailable_function("sharding.enable_sharded_gradient_tape", _PLANNED)
get_shard_from_colocation = unavailable_function("sharding.get_shard_from_colocation", _PLANNED)
get_sharding = unavailable_function("sharding.get_sharding", _PLANNED)
has_attr = unavailable_function("sharding.has_attr", _PLANNED)
propagate_sharding = unavailable_function("sharding.propagate_sharding", _PLANNED)
