"""AssumeEqualAcrossReplicas: values the compiler may treat as equal on
every replica."""

import keras
from keras import ops
from keras import tree

from keras_ipu.device.primitives.markers import assume_equal_across_replicas
from keras_ipu.layers._base import serializable


@serializable
class AssumeEqualAcrossReplicas(keras.layers.Layer):
    """Marks values as equal across replicas, so a conditional on them is not
    divergent control flow (Graphcore's Poplar would otherwise refuse a
    branch that contains a cross-replica operation). The values pass through
    unchanged.

    Args:
      inplace: whether the IPU marks the tensor in place (needed for tensor
        slices) or a copy of it.
    """

    def __init__(self, inplace=False, **kwargs):
        super().__init__(**kwargs)
        self.inplace = inplace

    def call(self, inputs, **kwargs):
        return tree.map_structure(
            lambda x: assume_equal_across_replicas(
                ops.convert_to_tensor(x), self.inplace),
            inputs)

    def get_config(self):
        return {**super().get_config(), "inplace": self.inplace}
