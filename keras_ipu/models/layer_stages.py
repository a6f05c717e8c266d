"""The pipeline stage Graphcore's `PipelineStage(n)` context gives Keras
layers (keras_ipu/models/pipeline_stage.py), recorded by the backend's
layer class: `keras_ipu.backend.layer.IPULayer` under the ipu backend, and
Keras' own `TFLayer` under KERAS_BACKEND=tensorflow (the import hook mixes
this class in, keras_ipu/_hook.py), so a tf.keras model made with
PipelineStage scopes is pipelined as on the ipu backend.

A layer constructed inside the context takes the stage
(`layer._pipeline_stage`), and so does each call of a layer made inside it
(`node._pipeline_stage` on the graph node the call records, through its
outputs); a call's stage wins over the layer's.

Every Keras layer of the process runs through here: it stays light. The
context's state lives in keras_ipu.distribute.scope; when that module has
not been imported, no PipelineStage context can be open (PipelineStage
imports it), so nothing is imported for layers made without one.
"""

import sys

_SCOPE = "keras_ipu.distribute.scope"


def _current_stage():
    scope = sys.modules.get(_SCOPE)
    return None if scope is None else scope.current_pipeline_stage()


class LayerStages:
    def __init__(self):
        # Keras' Layer.__init__ calls BackendLayer.__init__(self) alone.
        stage = _current_stage()
        if stage is not None:
            # Plain attribute: Keras' tracking must not see it.
            object.__setattr__(self, "_pipeline_stage", stage)

    def __call__(self, *args, **kwargs):
        outputs = super().__call__(*args, **kwargs)
        stage = _current_stage()
        if stage is not None:
            # A symbolic call's node is made after this returns (at the end
            # of Layer.__call__): its outputs carry the stage to it.
            for x in _flat(outputs):
                if type(x).__name__ == "KerasTensor":
                    x._pipeline_stage = stage
        return outputs


def with_layer_stages(backend_layer):
    """`backend_layer` (a Keras backend's layer class: TFLayer) recording
    the stages too, under the same name."""

    class Staged(LayerStages, backend_layer):
        def __init__(self, *args, **kwargs):
            backend_layer.__init__(self, *args, **kwargs)
            LayerStages.__init__(self)

    Staged.__name__ = Staged.__qualname__ = backend_layer.__name__
    Staged.__module__ = backend_layer.__module__
    return Staged


def _flat(outputs):
    if isinstance(outputs, (list, tuple)):
        return [y for x in outputs for y in _flat(x)]
    if isinstance(outputs, dict):
        return [y for x in outputs.values() for y in _flat(x)]
    return [outputs]
