"""keras_ipu.ops.application_compile_op: Compiling a function into an executable file. (Graphcore's
`tensorflow.python.ipu.ops.application_compile_op`, also `keras_ipu.application_compile_op`)."""

from keras_ipu._unavailable import unavailable_class
from keras_ipu._unavailable import unavailable_function

_PLANNED = "not implemented yet (issue 12)."

experimental_application_compile_op = unavailable_function("application_compile_op.experimental_application_compile_op", _PLANNED)
