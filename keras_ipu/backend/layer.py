"""The backend mixin of every Keras layer (`keras.layers.Layer` inherits it).

Keras gives each backend a place to hook into layers: JAX uses it for Flax
NNX modules, TensorFlow for tf.Module tracking. The ipu backend keeps the
pipeline stage a layer is given by Graphcore's `PipelineStage` context
(keras_ipu/models/pipeline_stage.py): a layer constructed inside the
context takes the stage (`layer._pipeline_stage`), and so does each call
of a layer made inside it (`node._pipeline_stage` on the graph node the
call records); a call's stage wins over the layer's.
"""

from keras_ipu.distribute import scope as _scope


class IPULayer:
    def __init__(self):
        stage = _scope.current_pipeline_stage()
        if stage is not None:
            # Plain attribute: Keras' tracking must not see it.
            object.__setattr__(self, "_pipeline_stage", stage)

    def __call__(self, *args, **kwargs):
        outputs = super().__call__(*args, **kwargs)
        stage = _scope.current_pipeline_stage()
        if stage is not None:
            # A symbolic call's node is made after this returns (at the end
            # of Layer.__call__): its outputs carry the stage to it.
            for x in _flat(outputs):
                if type(x).__name__ == "KerasTensor":
                    x._pipeline_stage = stage
        return outputs


def _flat(outputs):
    if isinstance(outputs, (list, tuple)):
        return [y for x in outputs for y in _flat(x)]
    if isinstance(outputs, dict):
        return [y for x in outputs.values() for y in _flat(x)]
    return [outputs]
