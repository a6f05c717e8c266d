"""keras_ipu.data.ops.dataset_ops: Graphcore's
`tensorflow.python.ipu.data.ops.dataset_ops` (BufferDataset)."""

from keras_ipu._unavailable import unavailable_class
from keras_ipu._unavailable import unavailable_function

_PLANNED = "not implemented yet (issue 12)."

BufferDataset = unavailable_class("data.ops.dataset_ops.BufferDataset", _PLANNED)
