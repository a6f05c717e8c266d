"""Embedding as Graphcore's IPU layer: a lookup that can be serialized over
the rows of the table; Keras' other arguments are refused."""

import keras
from keras import ops

from keras_ipu.layers._base import check_unsupported
from keras_ipu.layers._base import serializable


def embedding_lookup(params, ids, serialization_factor=1):
    """Rows `ids` of `params` (Graphcore's `embedding_ops.embedding_lookup`).

    With serialization_factor f > 1 the table is looked up as f slices of
    its rows, each lookup masked to the ids in its slice and the f results
    summed: the same values, in f smaller lookups (on the IPU this saves
    memory when the table also feeds another op, such as a tied projection).
    """
    serialization_factor = int(serialization_factor)
    if serialization_factor < 1:
        raise ValueError(
            f"serialization_factor has to be at least 1, but was "
            f"{serialization_factor}.")
    rows = params.shape[0]
    if rows % serialization_factor != 0:
        raise ValueError(
            f"The serialization_factor ({serialization_factor}) must divide the "
            f"size of the 0th dimension of params ({rows}).")
    ids = ops.cast(ids, "int32")
    if serialization_factor == 1:
        return ops.take(params, ids, axis=0)
    size = rows // serialization_factor
    result = None
    for i in range(serialization_factor):
        low = i * size
        table = ops.slice(params, (low,) + (0,) * (len(params.shape) - 1),
                          (size,) + tuple(params.shape[1:]))
        local = ids - low
        inside = ops.logical_and(ops.greater_equal(local, 0), ops.less(local, size))
        rows_ = ops.take(table, ops.where(inside, local, 0), axis=0)
        mask = ops.reshape(ops.cast(inside, rows_.dtype),
                           tuple(ids.shape) + (1,) * (len(params.shape) - 1))
        part = rows_ * mask
        result = part if result is None else result + part
    return result


@serializable
class Embedding(keras.layers.Layer):
    """A replacement for the typical uses of Keras' Embedding layer.

    Args:
      input_dim: size of the vocabulary (largest index + 1).
      output_dim: size of each embedding vector.
      embeddings_initializer: initializer of the table.
      serialization_factor: look the table up as this many slices of its
        rows (must divide input_dim); the result is the same.

    `embeddings_regularizer`, `activity_regularizer`, `embeddings_constraint`,
    `mask_zero` and `input_length` are refused with NotImplementedError, as
    Graphcore's layer refuses them. Input: [batch, input_length] integers;
    output: [batch, input_length, output_dim].
    """

    def __init__(self, input_dim, output_dim, embeddings_initializer="uniform",
                 embeddings_regularizer=None, activity_regularizer=None,
                 embeddings_constraint=None, mask_zero=False, input_length=None,
                 serialization_factor=1, **kwargs):
        kwargs["autocast"] = False
        super().__init__(**kwargs)
        self.input_dim = input_dim
        self.output_dim = output_dim
        self.embeddings_initializer = keras.initializers.get(embeddings_initializer)
        self.serialization_factor = serialization_factor
        check_unsupported(self, embeddings_regularizer, "embeddings_regularizer")
        check_unsupported(self, activity_regularizer, "activity_regularizer")
        check_unsupported(self, embeddings_constraint, "embeddings_constraint")
        check_unsupported(self, mask_zero, "mask_zero")
        check_unsupported(self, input_length, "input_length")

    def build(self, input_shape):
        if len(input_shape) != 2:
            raise ValueError(
                "The input shape should be a tensor of shape [batch, input_length]")
        self.embeddings = self.add_weight(
            shape=(self.input_dim, self.output_dim),
            initializer=self.embeddings_initializer, name="embeddings")

    def call(self, inputs, inputs_are_sorted=False, training=None):
        # inputs_are_sorted lets Poplar plan a sorted lookup; the values are
        # the same, so the simulator needs nothing from it.
        del inputs_are_sorted, training
        return embedding_lookup(self.embeddings, inputs, self.serialization_factor)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape) + (self.output_dim,)

    def get_config(self):
        return {
            **super().get_config(),
            "input_dim": self.input_dim,
            "output_dim": self.output_dim,
            "embeddings_initializer":
                keras.initializers.serialize(self.embeddings_initializer),
            "serialization_factor": self.serialization_factor,
        }
