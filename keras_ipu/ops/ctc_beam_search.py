"""Graphcore's CTC beam-search decoders (nn_ops.ctc_beam_search_decoder
and _with_log_probs) for TensorFlow code on the front end.

TensorFlow's own decoder (CTCBeamSearchDecoder) has no XLA kernel, and
Graphcore's runs on the IPU as a Popnn op; here the decoder is an XLA
custom call that the front end imports as the device's CTC prefix beam
search (device/primitives/ctc.py, the kernel and cost of
keras.ops.ctc_decode(strategy="beam_search") on the ipu backend), so it
runs inside the compiled program, costed, as Graphcore's.
"""

from keras_ipu.ops import xla_custom_call

TARGET = "KerasIpuCTCBeamSearch"


@xla_custom_call.import_rule(TARGET)
def _import(imp, instr, operands, config):
    from keras_ipu.device.primitives.ctc import ctc_beam_search_p

    log_probs, lengths = operands
    paths, scores = imp.bind(ctc_beam_search_p, imp.array(log_probs), imp.array(lengths),
                             beam_width=config["beam_width"],
                             top_paths=config["top_paths"], mask_index=config["blank_index"])
    return (paths, scores)


def decode(data, lengths, beam_width, top_paths, blank_index, name):
    """(negative log probabilities [batch, top_paths], lengths [batch,
    top_paths], labels [batch, top_paths, max_time]) of the top_paths most
    probable labelings of `data` [max_time, batch, classes] (logits or log
    probabilities: both are normalised by log-softmax, which leaves log
    probabilities as they are); labels past a path's length are the
    blank_index, as Graphcore's layer pads them."""
    import tensorflow as tf

    if top_paths > beam_width:
        raise ValueError(
            f"top_paths ({top_paths}) must be less than or equal to beam_width "
            f"({beam_width}).")
    with tf.name_scope(name or "ctc_beam_search"):
        data = tf.convert_to_tensor(data)
        if data.shape.rank != 3:
            raise ValueError(f"The data input must be [max_time, batch_size, num_classes], "
                             f"got shape {data.shape}.")
        time, batch, classes = data.shape.as_list()
        blank = blank_index + classes if blank_index < 0 else blank_index
        if not 0 <= blank < classes:
            raise ValueError(f"blank_index={blank_index} is not a class of the "
                             f"{classes} classes.")
        log_probs = tf.nn.log_softmax(tf.transpose(tf.cast(data, tf.float32), (1, 0, 2)))
        paths, scores = xla_custom_call.emit(
            TARGET, [log_probs, tf.cast(lengths, tf.int32)], [tf.int32, tf.float32],
            [[top_paths, batch, time], [batch, top_paths]],
            {"beam_width": int(beam_width), "top_paths": int(top_paths),
             "blank_index": int(blank)})
        paths = tf.transpose(paths, (1, 0, 2))  # [batch, top_paths, time]
        present = tf.not_equal(paths, -1)
        path_lengths = tf.reduce_sum(tf.cast(present, tf.int32), axis=-1)
        labels = tf.where(present, paths, blank)
        return tf.cast(-scores, data.dtype), path_lengths, labels
