"""keras_ipu.ipu_pipeline_estimator: Graphcore's
`tensorflow.python.ipu.ipu_pipeline_estimator`."""

from keras_ipu._unavailable import unavailable_class
from keras_ipu._unavailable import unavailable_function

_PLANNED = "not implemented yet (issue 12)."

IPUPipelineEstimator = unavailable_class("ipu_pipeline_estimator.IPUPipelineEstimator", _PLANNED)
IPUPipelineEstimatorSpec = unavailable_class("ipu_pipeline_estimator.IPUPipelineEstimatorSpec", _PLANNED)
