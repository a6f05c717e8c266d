"""keras_ipu.ipu_session_run_hooks: Graphcore's
`tensorflow.python.ipu.ipu_session_run_hooks`."""

from keras_ipu._unavailable import unavailable_class
from keras_ipu._unavailable import unavailable_function

_PLANNED = "not implemented yet (issue 12)."

IPULoggingTensorHook = unavailable_class("ipu_session_run_hooks.IPULoggingTensorHook", _PLANNED)
