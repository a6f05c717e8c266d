"""keras_ipu.data.ops: Graphcore's `tensorflow.python.ipu.data.ops`."""
