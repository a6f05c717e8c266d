"""RecomputationCheckpoint: values the backward pass keeps instead of
recomputing (compiler/recompute.py)."""

import keras
from keras import ops
from keras import tree

from keras_ipu.device.primitives.markers import recomputation_checkpoint
from keras_ipu.layers._base import serializable


@serializable
class RecomputationCheckpoint(keras.layers.Layer):
    """Checkpoints the values passing through it.

    With recomputation on (IPUConfig.allow_recompute, or a pipeline's
    recomputation_mode), these values are stored for the backward pass and
    the activations after them are recomputed from them, so only one
    segment between checkpoints is live at a time in the backward pass.
    Use it with RecomputationMode.RecomputeAndBackpropagateInterleaved; it
    has no effect with RecomputeThenBackpropagate, nor without
    recomputation. Values (and their gradients) pass through unchanged.
    """

    def call(self, inputs, **kwargs):
        return tree.map_structure(
            lambda x: recomputation_checkpoint(ops.convert_to_tensor(x)), inputs)
