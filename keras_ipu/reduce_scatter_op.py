"""tensorflow.python.ipu.reduce_scatter_op: the module keras_ipu.ops.reduce_scatter_op itself
(Graphcore's SDK exposes its operator modules at both paths)."""

import sys

from keras_ipu.ops import reduce_scatter_op as _module

sys.modules[__name__] = _module
