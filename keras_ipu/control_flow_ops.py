"""tensorflow.python.ipu.control_flow_ops: the module keras_ipu.ops.control_flow_ops itself
(Graphcore's SDK exposes its operator modules at both paths)."""

import sys

from keras_ipu.ops import control_flow_ops as _module

sys.modules[__name__] = _module
