"""tensorflow.python.ipu.all_to_all_op: the module keras_ipu.ops.all_to_all_op itself
(Graphcore's SDK exposes its operator modules at both paths)."""

import sys

from keras_ipu.ops import all_to_all_op as _module

sys.modules[__name__] = _module
