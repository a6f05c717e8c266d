"""tensorflow.python.ipu.embedding_ops: the module keras_ipu.ops.embedding_ops itself
(Graphcore's SDK exposes its operator modules at both paths)."""

import sys

from keras_ipu.ops import embedding_ops as _module

sys.modules[__name__] = _module
