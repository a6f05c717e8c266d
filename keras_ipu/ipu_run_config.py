"""keras_ipu.ipu_run_config: Graphcore's `tensorflow.python.ipu.ipu_run_config`
(the implementation is keras_ipu/estimators/run_config.py)."""

from keras_ipu.estimators.run_config import IPURunConfig
from keras_ipu.estimators.run_config import RunConfig

__all__ = ["IPURunConfig", "RunConfig"]
