"""keras_ipu.ops.nn_ops: Popnn primitive neural network operators. (Graphcore's
`tensorflow.python.ipu.ops.nn_ops`, also `keras_ipu.nn_ops`).

The activations are TensorFlow functions (for TensorFlow code compiled
through the TensorFlow front end) with Popnn's definitions, the numbers of
the Keras activations of the same name. The losses are TensorFlow's own
formulas, which XLA compiles (CTC's dense-label loss, the sampled losses
with Graphcore's choice of not removing accidental hits; their default
sampler runs on the device: ops/candidate_sampling.py).
"""

from keras_ipu.ops import candidate_sampling
from keras_ipu.ops import ctc_beam_search


def ctc_beam_search_decoder(logits, logits_lengths, beam_width=100, top_paths=1,
                            blank_index=-1, name=None):
    """CTC predictions by beam search of `logits` [max_time, batch_size,
    num_classes] with `logits_lengths` [batch_size] valid time steps each.

    Returns (negative log probabilities [batch_size, top_paths], label
    lengths [batch_size, top_paths], labels [batch_size, top_paths,
    max_time]) of the top_paths most likely labelings, most likely first.
    top_paths must not exceed beam_width; a negative blank_index counts
    from the last class (-1: the last, as TensorFlow's decoder's blank).
    The search is the device's CTC beam search, run in the compiled
    program (ops/ctc_beam_search.py)."""
    return ctc_beam_search.decode(logits, logits_lengths, beam_width, top_paths,
                                  blank_index, name)


def ctc_beam_search_decoder_with_log_probs(log_probs, input_lengths, beam_width=100,
                                           top_paths=1, blank_index=-1, name=None):
    """ctc_beam_search_decoder for `log_probs` given as log probabilities
    (each time step's log-softmax over the classes)."""
    return ctc_beam_search.decode(log_probs, input_lengths, beam_width, top_paths,
                                  blank_index, name)


def _ctc_out_dtype(data, out_dtype, what):
    import tensorflow as tf

    if out_dtype is None:
        return data.dtype
    out_dtype = tf.as_dtype(out_dtype)
    if data.dtype == tf.float32 and out_dtype == tf.float16:
        raise ValueError(f"out_dtype cannot be float16 when dtype of {what} is float32.")
    return out_dtype


def _ctc(labels, data, label_length, data_length, blank_index, out_dtype, name, what):
    import tensorflow as tf

    with tf.name_scope(name or "ctc_loss"):
        data = tf.convert_to_tensor(data)
        dtype = _ctc_out_dtype(data, out_dtype, what)
        # TensorFlow's dense-label CTC (a forward-backward scan XLA compiles);
        # it normalises with log_softmax, which leaves log probabilities as
        # they are.
        loss = tf.nn.ctc_loss(
            labels=tf.cast(labels, tf.int32), logits=tf.cast(data, tf.float32),
            label_length=tf.cast(label_length, tf.int32),
            logit_length=tf.cast(data_length, tf.int32),
            logits_time_major=True, blank_index=blank_index)
        return tf.cast(loss, dtype)


def ctc_loss_v2(labels, logits, label_length, logit_length, blank_index, out_dtype=None,
                name=None):
    """CTC loss of `logits` [max_time, batch_size, num_classes] for the
    dense `labels` [batch_size, max_label_length]: a [batch_size] tensor
    of negative log-likelihoods (out_dtype: the logits' by default; not
    float16 for float32 logits)."""
    return _ctc(labels, logits, label_length, logit_length, blank_index, out_dtype, name,
                "logits")


def ctc_loss_with_log_probs(labels, data, label_length, data_length, blank_index,
                            out_dtype=None, name=None):
    """ctc_loss_v2 for `data` given as log probabilities (each time step's
    log-softmax over the classes)."""
    return _ctc(labels, data, label_length, data_length, blank_index, out_dtype, name,
                "data")


def multi_conv(func=None, options=None):
    """Decorator: the convolutions of `func` as one multi-convolution.

    On the IPU, Poplar runs the independent convolutions of the function in
    parallel on disjoint sets of tiles; the values are those of `func`.
    Here the function runs as written (XLA compiles its convolutions, the
    simulator costs them one after another); `options` must be a dict of
    PopLibs multi-convolution flags, which have no effect on the values."""

    def decorated(inner_func):
        def multi_conv_wrapper(*args):
            if options is not None and not isinstance(options, dict):
                raise TypeError(
                    "Expected the multi_conv `options` to be a `dict`, but got %s instead."
                    % str(options))
            import tensorflow as tf

            with tf.name_scope("multi_conv"):
                return inner_func(*args)

        multi_conv_wrapper.__name__ = getattr(inner_func, "__name__", "multi_conv")
        multi_conv_wrapper.__doc__ = getattr(inner_func, "__doc__", None)
        return multi_conv_wrapper

    if func is not None:
        return decorated(func)
    return decorated


def _default_sampled_values(labels, num_true, num_sampled, num_classes, seed=None):
    """Graphcore's default for sampled_values=None: TensorFlow's
    log-uniform sampler with unique=True (on the IPU: ops/candidate_sampling.py)."""
    import tensorflow as tf

    return candidate_sampling.log_uniform_candidate_sampler(
        tf.cast(labels, tf.int64), num_true, num_sampled, True, num_classes, seed=seed)


def nce_loss(weights, biases, labels, inputs, num_sampled, num_classes, num_true=1,
             sampled_values=None, name="nce_loss"):
    """Noise-contrastive estimation loss per example (Graphcore's: the
    sampled logits of TensorFlow's nce_loss, accidental hits kept). With
    `sampled_values=None` the classes are drawn by the log-uniform
    candidate sampler (unique), inside a compiled function on the device."""
    import tensorflow as tf

    if sampled_values is None:
        sampled_values = _default_sampled_values(labels, num_true, num_sampled, num_classes)
    return tf.nn.nce_loss(weights, biases, labels, inputs, num_sampled, num_classes,
                          num_true=num_true, sampled_values=sampled_values,
                          remove_accidental_hits=False, name=name)


def sampled_softmax_loss(weights, biases, labels, inputs, num_sampled, num_classes,
                         num_true=1, sampled_values=None, name="sampled_softmax_loss",
                         seed=None):
    """Sampled softmax loss per example (Graphcore's: TensorFlow's
    sampled_softmax_loss, accidental hits kept). `sampled_values=None`
    samples as nce_loss does (`seed` is TensorFlow's op seed outside a
    compiled function; on the device reset_ipu_seed fixes the draws)."""
    import tensorflow as tf

    if sampled_values is None:
        sampled_values = _default_sampled_values(labels, num_true, num_sampled, num_classes,
                                                 seed)
    return tf.nn.sampled_softmax_loss(weights, biases, labels, inputs, num_sampled,
                                      num_classes, num_true=num_true,
                                      sampled_values=sampled_values,
                                      remove_accidental_hits=False, seed=seed, name=name)


def gelu(x, approximate=True, name=None):
    """GELU: x * Phi(x), with the tanh approximation when `approximate`
    (Popnn's default), else with erf."""
    import tensorflow as tf

    with tf.name_scope(name or "gelu"):
        return tf.nn.gelu(tf.convert_to_tensor(x), approximate=approximate)


def hard_sigmoid(x, name=None):
    """Hard sigmoid: clip(0.2 * x + 0.5, 0, 1) (Popnn's and Keras 2's)."""
    import tensorflow as tf

    with tf.name_scope(name or "hard_sigmoid"):
        x = tf.convert_to_tensor(x)
        return tf.clip_by_value(0.2 * x + 0.5, tf.zeros((), x.dtype), tf.ones((), x.dtype))


def swish(x, name=None):
    """Swish: x * sigmoid(x)."""
    import tensorflow as tf

    with tf.name_scope(name or "swish"):
        x = tf.convert_to_tensor(x)
        return x * tf.sigmoid(x)


def softmax(x, stable=False, name=None):
    """Softmax over the last axis; `stable` subtracts the maximum first
    (the same values where the plain form does not overflow)."""
    import tensorflow as tf

    with tf.name_scope(name or "softmax"):
        x = tf.convert_to_tensor(x)
        if stable:
            x = x - tf.stop_gradient(tf.reduce_max(x, axis=-1, keepdims=True))
        e = tf.exp(x)
        return e / tf.reduce_sum(e, axis=-1, keepdims=True)
