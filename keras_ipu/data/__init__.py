"""keras_ipu.data: Graphcore's `tensorflow.python.ipu.data` (dataset wrappers)."""
