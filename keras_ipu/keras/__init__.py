"""keras_ipu.keras: the `ipu.keras` namespace of Graphcore's Keras (the
`keras.ipu` module of its Keras fork): PipelineStage, the pipeline stage
assignment classes, ReplicatedMetricReductionMethod, the SDK 2.1 model
classes (Model, Sequential, PipelineModel, PipelineSequential) and the IPU
layers (`ipu.keras.layers`, which is keras_ipu.layers).
"""

import importlib as _importlib

from keras_ipu.models.options import ReplicatedMetricReductionMethod  # noqa: F401
from keras_ipu.models.pipeline_stage import PipelineStage  # noqa: F401
from keras_ipu.models.stage_assignment import (  # noqa: F401
    FunctionalLayerPipelineStageAssignment,
    FunctionalNestedModelPipelineStageAssignment,
    ModelLayerPipelineStageAssignment,
    NestedModelPipelineStageAssignment,
    SequentialLayerPipelineStageAssignment,
    SequentialNestedModelPipelineStageAssignment,
)

# Imported on first use: the SDK 2.1 classes import Keras models, the
# layers are another package.
_LAZY = {
    "Model": "keras_ipu.models.sdk21",
    "Sequential": "keras_ipu.models.sdk21",
    "PipelineModel": "keras_ipu.models.sdk21",
    "PipelineSequential": "keras_ipu.models.sdk21",
    "SequentialPipelineModel": "keras_ipu.models.sdk21",
    "extensions": "keras_ipu.models.extension",
}


# Modules: ipu.keras.layers is keras_ipu.layers; ipu.keras.optimizers is
# this package's optimizers module (the IPU optimizers' Keras wrappers).
_MODULES = {"layers": "keras_ipu.layers", "optimizers": __name__ + ".optimizers"}


def __getattr__(name):
    if name in _MODULES:
        try:
            module = _importlib.import_module(_MODULES[name])
        except ModuleNotFoundError as e:
            if e.name != _MODULES[name]:
                raise
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
        globals()[name] = module
        return module
    if name in _LAZY:
        module = _importlib.import_module(_LAZY[name])
        value = module if name == "extensions" else getattr(module, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY) | set(_MODULES))
