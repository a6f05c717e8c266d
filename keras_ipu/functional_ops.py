"""tensorflow.python.ipu.functional_ops: the module keras_ipu.ops.functional_ops itself
(Graphcore's SDK exposes its operator modules at both paths)."""

import sys

from keras_ipu.ops import functional_ops as _module

sys.modules[__name__] = _module
