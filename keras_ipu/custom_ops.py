"""tensorflow.python.ipu.custom_ops: the module keras_ipu.ops.custom_ops itself
(Graphcore's SDK exposes its operator modules at both paths)."""

import sys

from keras_ipu.ops import custom_ops as _module

sys.modules[__name__] = _module
