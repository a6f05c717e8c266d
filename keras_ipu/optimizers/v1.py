"""Graphcore's TensorFlow 1 optimizer wrappers (`tensorflow.python.ipu.optimizers`)
for tf.compat.v1.train optimizers."""

from keras_ipu._unavailable import unavailable_class

_PLANNED = "not implemented yet (issue 12)."

CrossReplicaGradientAccumulationOptimizer = unavailable_class(
    "optimizers.CrossReplicaGradientAccumulationOptimizer", _PLANNED)
CrossReplicaGradientAccumulationOptimizerV2 = unavailable_class(
    "optimizers.CrossReplicaGradientAccumulationOptimizerV2", _PLANNED)
CrossReplicaOptimizer = unavailable_class("optimizers.CrossReplicaOptimizer", _PLANNED)
GradientAccumulationOptimizer = unavailable_class("optimizers.GradientAccumulationOptimizer", _PLANNED)
GradientAccumulationOptimizerV2 = unavailable_class("optimizers.GradientAccumulationOptimizerV2", _PLANNED)
IpuOptimizer = unavailable_class("optimizers.IpuOptimizer", _PLANNED)
MapGradientOptimizer = unavailable_class("optimizers.MapGradientOptimizer", _PLANNED)
ShardedOptimizer = unavailable_class("optimizers.ShardedOptimizer", _PLANNED)
