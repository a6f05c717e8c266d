"""keras_ipu.ipu_estimator: Graphcore's `tensorflow.python.ipu.ipu_estimator`
(IPUEstimator, IPUEstimatorSpec)."""

from keras_ipu._unavailable import unavailable_class
from keras_ipu._unavailable import unavailable_function

_PLANNED = "not implemented yet (issue 12)."

IPUEstimator = unavailable_class("ipu_estimator.IPUEstimator", _PLANNED)
IPUEstimatorSpec = unavailable_class("ipu_estimator.IPUEstimatorSpec", _PLANNED)
