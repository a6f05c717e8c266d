"""keras_ipu.ipu_strategy: Graphcore's `tensorflow.python.ipu.ipu_strategy`
(the strategy itself lives in keras_ipu/distribute/)."""

from keras_ipu.distribute.strategy import IPUStrategy  # noqa: F401
from keras_ipu.distribute.strategy import IPUStrategyV1  # noqa: F401
