"""The backend mixin of every Keras layer (`keras.layers.Layer` inherits it).

Keras gives each backend a place to hook into layers: JAX uses it for Flax
NNX modules, TensorFlow for tf.Module tracking. The ipu backend keeps the
pipeline stage a layer is given by Graphcore's `PipelineStage` context
(keras_ipu/models/layer_stages.py, which Keras' TensorFlow layer gets too).
"""

from keras_ipu.models.layer_stages import LayerStages


class IPULayer(LayerStages):
    pass
