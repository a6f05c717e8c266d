"""keras_ipu.ops.image_ops: Image operations. (Graphcore's
`tensorflow.python.ipu.ops.image_ops`, also `keras_ipu.image_ops`)."""

from keras_ipu._unavailable import unavailable_class
from keras_ipu._unavailable import unavailable_function

_PLANNED = "not implemented yet (issue 12)."

normalise_image = unavailable_function("image_ops.normalise_image", _PLANNED)
