"""tensorflow.python.ipu.application_compile_op: the module keras_ipu.ops.application_compile_op itself
(Graphcore's SDK exposes its operator modules at both paths)."""

import sys

from keras_ipu.ops import application_compile_op as _module

sys.modules[__name__] = _module
