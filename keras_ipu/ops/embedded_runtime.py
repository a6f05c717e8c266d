"""keras_ipu.ops.embedded_runtime: The embedded application runtime. (Graphcore's
`tensorflow.python.ipu.ops.embedded_runtime`, also `keras_ipu.embedded_runtime`)."""

from keras_ipu._unavailable import unavailable_class
from keras_ipu._unavailable import unavailable_function

_PLANNED = "not implemented yet (issue 12)."

RuntimeContext = unavailable_class("embedded_runtime.RuntimeContext", _PLANNED)
embedded_runtime_call = unavailable_function("embedded_runtime.embedded_runtime_call", _PLANNED)
embedded_runtime_start = unavailable_function("embedded_runtime.embedded_runtime_start", _PLANNED)
embedded_runtime_start_and_call = unavailable_function("embedded_runtime.embedded_runtime_start_and_call", _PLANNED)
embedded_runtime_stop = unavailable_function("embedded_runtime.embedded_runtime_stop", _PLANNED)
