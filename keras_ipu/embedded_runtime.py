"""tensorflow.python.ipu.embedded_runtime: the module keras_ipu.ops.embedded_runtime itself
(Graphcore's SDK exposes its operator modules at both paths)."""

import sys

from keras_ipu.ops import embedded_runtime as _module

sys.modules[__name__] = _module
