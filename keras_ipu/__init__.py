"""keras_ipu: Keras 3 on a simulated Graphcore IPU.

The public namespace is shaped like `tensorflow.python.ipu`; submodules are
imported lazily so that `import keras_ipu` stays light (no TensorFlow).
"""

__version__ = "0.1.0"

from keras_ipu._lazy_modules import lazy_submodules as _lazy_submodules

# Public submodules, imported on first attribute access so that
# `import keras_ipu` stays light (DESIGN decision 8).
__getattr__, __dir__ = _lazy_submodules(__name__, {
    "config", "distribute", "distributed", "gradient_accumulation", "horovod",
    "ipu_multi_worker_strategy", "ipu_strategy", "keras", "layers", "models", "ops",
    "optimizers", "popdist", "utils",
    # TensorFlow code compiled through XLA (keras_ipu/frontends/tensorflow).
    "ipu_compiler", "ipu_infeed_queue", "ipu_outfeed_queue", "loops", "scopes",
    # The rest of Graphcore's API (issue 12): estimators, serving, datasets,
    # sharding and the operator modules (also under keras_ipu.ops).
    "data", "dataset_benchmark", "ipu_estimator", "ipu_pipeline_estimator",
    "ipu_run_config", "ipu_session_run_hooks", "serving", "sharding",
    "all_to_all_op", "application_compile_op", "control_flow_ops",
    "cross_replica_ops", "custom_ops", "embedded_runtime", "embedding_ops",
    "functional_ops", "image_ops", "internal_ops", "math_ops", "nn_ops",
    "normalization_ops", "pipelining_ops", "rand_ops", "reduce_scatter_op",
    "replication_ops", "slicing_ops", "statistics_ops", "within_replica_ops",
})
