"""IPU Keras optimizers: Graphcore's `ipu_tensorflow_addons.keras.optimizers`
(AdamIpuOptimizer, LAMBIpuOptimizer, SGDIpuOptimizer) on KERAS_BACKEND=ipu.

The Keras gradient-accumulation wrapper of SDK 2.x lives at
`keras_ipu.keras.optimizers.GradientAccumulationOptimizer` (its module is
keras_ipu/optimizers/gradient_accumulation.py): at `keras_ipu.optimizers`
that name is the TensorFlow 1 optimizer's, as in `tensorflow.python.ipu`.
"""

from keras_ipu.optimizers.adam import AdamIpuOptimizer
from keras_ipu.optimizers.ipu_optimizer_base import IpuOptimizerBase
from keras_ipu.optimizers.lamb import LAMBIpuOptimizer
from keras_ipu.optimizers.sgd import SGDIpuOptimizer

__all__ = [
    "AdamIpuOptimizer",
    "IpuOptimizerBase",
    "LAMBIpuOptimizer",
    "SGDIpuOptimizer",
]
