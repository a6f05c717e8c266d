"""keras_ipu.ipu_pipeline_estimator: Graphcore's
`tensorflow.python.ipu.ipu_pipeline_estimator` (the implementation is
keras_ipu/estimators/pipeline_estimator.py)."""

from keras_ipu.estimators.pipeline_estimator import IPUPipelineEstimator
from keras_ipu.estimators.pipeline_estimator import IPUPipelineEstimatorSpec

__all__ = ["IPUPipelineEstimator", "IPUPipelineEstimatorSpec"]
