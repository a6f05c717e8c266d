"""keras_ipu.dataset_benchmark: Graphcore's `tensorflow.python.ipu.dataset_benchmark`."""

from keras_ipu._unavailable import unavailable_class
from keras_ipu._unavailable import unavailable_function

_PLANNED = "not implemented yet (issue 12)."

dataset_benchmark = unavailable_function("dataset_benchmark.dataset_benchmark", _PLANNED)
infeed_benchmark = unavailable_function("dataset_benchmark.infeed_benchmark", _PLANNED)
