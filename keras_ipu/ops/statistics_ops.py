"""keras_ipu.ops.statistics_ops: Statistics operators. (Graphcore's
`tensorflow.python.ipu.ops.statistics_ops`, also `keras_ipu.statistics_ops`)."""

from keras_ipu._unavailable import unavailable_class
from keras_ipu._unavailable import unavailable_function

_PLANNED = "not implemented yet (issue 12)."

fixed_width_bins = unavailable_function("statistics_ops.fixed_width_bins", _PLANNED)
histogram = unavailable_function("statistics_ops.histogram", _PLANNED)
histogram_update = unavailable_function("statistics_ops.histogram_update", _PLANNED)
