"""tensorflow.python.ipu.image_ops: the module keras_ipu.ops.image_ops itself
(Graphcore's SDK exposes its operator modules at both paths)."""

import sys

from keras_ipu.ops import image_ops as _module

sys.modules[__name__] = _module
