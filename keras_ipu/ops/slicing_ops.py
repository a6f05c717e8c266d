"""keras_ipu.ops.slicing_ops: Slicing operators. (Graphcore's
`tensorflow.python.ipu.ops.slicing_ops`, also `keras_ipu.slicing_ops`)."""

from keras_ipu._unavailable import unavailable_class
from keras_ipu._unavailable import unavailable_function

_PLANNED = "not implemented yet (issue 12)."

sequence_slice = unavailable_function("slicing_ops.sequence_slice", _PLANNED)
sequence_slice_pack = unavailable_function("slicing_ops.sequence_slice_pack", _PLANNED)
sequence_slice_unpack = unavailable_function("slicing_ops.sequence_slice_unpack", _PLANNED)
