"""keras_ipu.ops.normalization_ops: Popnn normalization operators. (Graphcore's
`tensorflow.python.ipu.ops.normalization_ops`, also `keras_ipu.normalization_ops`)."""

from keras_ipu._unavailable import unavailable_class
from keras_ipu._unavailable import unavailable_function

_PLANNED = "not implemented yet (issue 12)."

group_norm = unavailable_function("normalization_ops.group_norm", _PLANNED)
instance_norm = unavailable_function("normalization_ops.instance_norm", _PLANNED)
layer_norm = unavailable_function("normalization_ops.layer_norm", _PLANNED)
