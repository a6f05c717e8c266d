"""tensorflow.python.ipu.cross_replica_ops: the module keras_ipu.ops.cross_replica_ops itself
(Graphcore's SDK exposes its operator modules at both paths)."""

import sys

from keras_ipu.ops import cross_replica_ops as _module

sys.modules[__name__] = _module
