"""keras_ipu.ops: the `tensorflow.python.ipu.ops` namespace: every
operator module of Graphcore's `tensorflow.python.ipu.ops`, imported on
first use (the TensorFlow ones import TensorFlow then)."""

from keras_ipu._lazy_modules import lazy_submodules as _lazy_submodules

__getattr__, __dir__ = _lazy_submodules(__name__, {
    "all_to_all_op",
    "application_compile_op",
    "control_flow_ops",
    "cross_replica_ops",
    "custom_ops",
    "embedded_runtime",
    "embedding_ops",
    "functional_ops",
    "image_ops",
    "internal_ops",
    "math_ops",
    "nn_ops",
    "normalization_ops",
    "pipelining_ops",
    "rand_ops",
    "reduce_scatter_op",
    "replication_ops",
    "slicing_ops",
    "statistics_ops",
    "within_replica_ops",
})
