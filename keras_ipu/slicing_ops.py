"""tensorflow.python.ipu.slicing_ops: the module keras_ipu.ops.slicing_ops itself
(Graphcore's SDK exposes its operator modules at both paths)."""

import sys

from keras_ipu.ops import slicing_ops as _module

sys.modules[__name__] = _module
