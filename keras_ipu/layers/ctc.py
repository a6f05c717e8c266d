"""CTC (Connectionist Temporal Classification) layers as Graphcore's: loss,
beam-search inference and the most probable prediction, on time-major data
[max_time, batch, num_classes]."""

import keras
from keras import ops

from keras_ipu.layers._base import serializable


def _batch_major(data):
    return ops.transpose(data, (1, 0, 2))


@serializable
class CTCLoss(keras.layers.Layer):
    """The mean CTC loss of a batch, as a [1] tensor.

    Args:
      blank_index: the class of the blank label.
      from_logits: whether `data` holds logits (True) or log probabilities
        (False, the default).

    Call: `loss(labels, data, label_length, data_length)` with labels
    [batch, max_label_length], data [max_time, batch, num_classes] and the
    lengths [batch]. Compile the model with a loss that returns y_pred.
    """

    def __init__(self, blank_index=0, from_logits=False, **kwargs):
        super().__init__(**kwargs)
        self.blank_index = blank_index
        self.from_logits = from_logits

    def call(self, labels, data, label_length, data_length, **kwargs):
        # keras.ops.ctc_loss normalizes its input with log_softmax, which
        # leaves log probabilities as they are: one path for both forms.
        loss = ops.ctc_loss(labels, _batch_major(data), label_length, data_length,
                            mask_index=self.blank_index)
        return ops.reshape(ops.cast(ops.mean(loss), data.dtype), (1,))

    def compute_output_spec(self, labels, data, label_length, data_length, **kwargs):
        return keras.KerasTensor((1,), dtype=data.dtype)

    def get_config(self):
        return {**super().get_config(), "blank_index": self.blank_index,
                "from_logits": self.from_logits}


def _traced_for_the_ipu_by_tensorflow():
    if keras.backend.backend() != "tensorflow":
        return False
    from keras_ipu.frontends.tensorflow.function import tracing_for_ipu

    return tracing_for_ipu()


def beam_search(data, data_length, blank_index, beam_width, top_paths):
    """(negative log probabilities [batch, top_paths], lengths [batch,
    top_paths], labels [batch, top_paths, max_time]) of the top_paths most
    probable label sequences; labels past a path's length are blank_index.
    """
    if top_paths > beam_width:
        raise ValueError(
            f"top_paths ({top_paths}) must be less than or equal to beam_width "
            f"({beam_width}).")
    if _traced_for_the_ipu_by_tensorflow():
        # Keras' TensorFlow ctc_decode is TensorFlow's decoder, which has no
        # XLA kernel: on the front end the search is the device's, as
        # Graphcore's nn_ops decoder (the same outputs as below).
        from keras_ipu.ops import ctc_beam_search

        return ctc_beam_search.decode(data, data_length, beam_width, top_paths,
                                      blank_index, None)
    paths, scores = ops.ctc_decode(
        _batch_major(data), ops.cast(data_length, "int32"),
        strategy="beam_search", beam_width=beam_width, top_paths=top_paths,
        mask_index=blank_index)
    paths = ops.transpose(paths, (1, 0, 2))  # [batch, top_paths, time]
    present = ops.not_equal(paths, -1)
    lengths = ops.sum(ops.cast(present, "int32"), axis=-1)
    labels = ops.where(present, paths, blank_index)
    return ops.negative(scores), lengths, ops.cast(labels, "int32")


class _CTCDecoder(keras.layers.Layer):
    """The arguments of the beam-search layers."""

    def __init__(self, blank_index=0, beam_width=100, top_paths=1,
                 from_logits=False, **kwargs):
        super().__init__(**kwargs)
        self.blank_index = blank_index
        self.beam_width = beam_width
        self.top_paths = top_paths
        self.from_logits = from_logits

    def _search(self, data, data_length):
        return beam_search(data, data_length, self.blank_index, self.beam_width,
                           self.top_paths)

    def get_config(self):
        return {**super().get_config(), "blank_index": self.blank_index,
                "beam_width": self.beam_width, "top_paths": self.top_paths,
                "from_logits": self.from_logits}


@serializable
class CTCInferenceLayer(_CTCDecoder):
    """CTC predictions by beam search.

    Args:
      blank_index: the class of the blank label.
      beam_width: the beam width of the search.
      top_paths: how many paths to return (at most beam_width).
      from_logits: whether `data` holds logits (True) or log probabilities
        (False, the default).

    Call: `layer(data, data_length)` with data [max_time, batch,
    num_classes]; returns (negative log probabilities of each path
    [batch, top_paths], each path's length [batch, top_paths], the labels
    [batch, top_paths, max_time], blank_index past each path's length).
    """

    def call(self, data, data_length, **kwargs):
        return self._search(data, data_length)

    def compute_output_spec(self, data, data_length, **kwargs):
        time, batch = data.shape[0], data.shape[1]
        return (keras.KerasTensor((batch, self.top_paths), dtype=data.dtype),
                keras.KerasTensor((batch, self.top_paths), dtype="int32"),
                keras.KerasTensor((batch, self.top_paths, time), dtype="int32"))


@serializable
class CTCPredictionsLayer(_CTCDecoder):
    """The most probable CTC prediction of each sequence: the beam search of
    CTCInferenceLayer, its most probable path, and blank_index after the
    path's length. Arguments as CTCInferenceLayer's; call with (data,
    data_length); returns labels [batch, max_time]."""

    def call(self, data, data_length, **kwargs):
        probs, lengths, labels = self._search(data, data_length)
        # The smallest negative log probability is the most probable path.
        best = ops.expand_dims(ops.argmin(probs, axis=1), 1)
        best_labels = ops.take_along_axis(labels, ops.expand_dims(best, 2), axis=1)
        best_length = ops.take_along_axis(lengths, best, axis=1)
        best_labels = ops.squeeze(best_labels, 1)
        steps = ops.arange(best_labels.shape[-1], dtype="int32")
        return ops.where(ops.less(steps, best_length), best_labels, self.blank_index)

    def compute_output_spec(self, data, data_length, **kwargs):
        return keras.KerasTensor((data.shape[1], data.shape[0]), dtype="int32")
