"""keras_ipu.serving: Graphcore's `tensorflow.python.ipu.serving`
(export_single_step: keras_ipu/export/serving_export.py)."""

from keras_ipu._unavailable import unavailable_function
from keras_ipu.export.serving_export import export_single_step  # noqa: F401


def __getattr__(name):
    # `Tensor` is TensorFlow's graph tensor (Graphcore's module imports
    # ops.Tensor, which TensorFlow 2.13+ calls SymbolicTensor: the class
    # with the documented device/graph/op/value_index).
    if name == "Tensor":
        from tensorflow.python.framework import ops

        return ops.SymbolicTensor
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


_PLANNED = "not implemented yet (issue 12)."

export_pipeline = unavailable_function("serving.export_pipeline", _PLANNED)
