"""The deprecated path of keras_ipu.distributed.popdist_strategy."""

from keras_ipu.distributed.popdist_strategy import *  # noqa: F401,F403
from keras_ipu.distributed.popdist_strategy import PopDistStrategy  # noqa: F401
