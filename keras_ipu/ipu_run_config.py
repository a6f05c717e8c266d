"""keras_ipu.ipu_run_config: Graphcore's `tensorflow.python.ipu.ipu_run_config`."""

from keras_ipu._unavailable import unavailable_class
from keras_ipu._unavailable import unavailable_function

_PLANNED = "not implemented yet (issue 12)."

IPURunConfig = unavailable_class("ipu_run_config.IPURunConfig", _PLANNED)
RunConfig = unavailable_class("ipu_run_config.RunConfig", _PLANNED)
