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

# Graphcore's TensorFlow 1 optimizer wrappers (tensorflow.python.ipu.optimizers,
# for tf.compat.v1.train optimizers): imported on first use, they import
# TensorFlow.
_V1 = {
    "CrossReplicaGradientAccumulationOptimizer": "keras_ipu.optimizers.v1",
    "CrossReplicaGradientAccumulationOptimizerV2": "keras_ipu.optimizers.v1",
    "CrossReplicaOptimizer": "keras_ipu.optimizers.v1",
    "GradientAccumulationOptimizer": "keras_ipu.optimizers.v1",
    "GradientAccumulationOptimizerV2": "keras_ipu.optimizers.v1",
    "IpuOptimizer": "keras_ipu.optimizers.v1",
    "MapGradientOptimizer": "keras_ipu.optimizers.v1",
    "ShardedOptimizer": "keras_ipu.optimizers.v1",
}


def __getattr__(name):
    if name == "GradientAccumulationReductionMethod":
        from keras_ipu.gradient_accumulation import GradientAccumulationReductionMethod

        return GradientAccumulationReductionMethod
    if name in _V1:
        import importlib

        value = getattr(importlib.import_module(_V1[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "AdamIpuOptimizer",
    "IpuOptimizerBase",
    "LAMBIpuOptimizer",
    "SGDIpuOptimizer",
]
