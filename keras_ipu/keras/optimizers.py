"""`ipu.keras.optimizers`: the Keras optimizer wrappers of Graphcore's
SDK 2.x (`tensorflow.python.ipu.keras.optimizers`)."""

from keras_ipu.optimizers.gradient_accumulation import GradientAccumulationOptimizer

__all__ = ["GradientAccumulationOptimizer"]

_MISSING = ("IpuOptimizer", "CrossReplicaOptimizer", "MapGradientOptimizer")


def __getattr__(name):
    if name in _MISSING:
        raise NotImplementedError(
            f"keras_ipu.keras.optimizers.{name} is not implemented: of the "
            "SDK 2.x Keras optimizer wrappers only GradientAccumulationOptimizer "
            "is (replicas all-reduce gradients in the compiled step itself).")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
