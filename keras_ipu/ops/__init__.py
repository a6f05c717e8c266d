"""keras_ipu.ops: the `tensorflow.python.ipu.ops` namespace: every
operator module of Graphcore's `tensorflow.python.ipu.ops`, imported on
first use (the TensorFlow ones import TensorFlow then)."""

import importlib as _importlib

_LAZY_SUBMODULES = frozenset({
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


def __getattr__(name):
    if name in _LAZY_SUBMODULES:
        module = _importlib.import_module(f"{__name__}.{name}")
        globals()[name] = module
        return module
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | _LAZY_SUBMODULES)
