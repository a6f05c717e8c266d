"""keras_ipu.ipu_estimator: Graphcore's `tensorflow.python.ipu.ipu_estimator`
(IPUEstimator, IPUEstimatorSpec; ModeKeys, as tf.estimator.ModeKeys is gone
from TensorFlow 2.16). The implementation is keras_ipu/estimators."""

from keras_ipu.estimators.estimator import IPUEstimator
from keras_ipu.estimators.spec import IPUEstimatorSpec
from keras_ipu.estimators.spec import ModeKeys

__all__ = ["IPUEstimator", "IPUEstimatorSpec", "ModeKeys"]
