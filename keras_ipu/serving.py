"""keras_ipu.serving: Graphcore's `tensorflow.python.ipu.serving`
(export_single_step, export_pipeline: keras_ipu/export/serving_export.py;
export_keras: keras_ipu/export/keras_serving.py)."""

from keras_ipu.export.keras_serving import export_keras  # noqa: F401
from keras_ipu.export.serving_export import export_pipeline  # noqa: F401
from keras_ipu.export.serving_export import export_single_step  # noqa: F401


def __getattr__(name):
    # `Tensor` is TensorFlow's graph tensor (Graphcore's module imports
    # ops.Tensor, which TensorFlow 2.13+ calls SymbolicTensor: the class
    # with the documented device/graph/op/value_index).
    if name == "Tensor":
        from tensorflow.python.framework import ops

        return ops.SymbolicTensor
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

