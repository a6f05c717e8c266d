"""keras_ipu.ops.nn_ops: Popnn primitive neural network operators. (Graphcore's
`tensorflow.python.ipu.ops.nn_ops`, also `keras_ipu.nn_ops`).

The activations are TensorFlow functions (for TensorFlow code compiled
through the TensorFlow front end) with Popnn's definitions, the numbers of
the Keras activations of the same name.
"""

from keras_ipu._unavailable import PLANNED
from keras_ipu._unavailable import declare_unavailable

declare_unavailable(
    globals(), "nn_ops", PLANNED,
    functions=(
        "ctc_beam_search_decoder", "ctc_beam_search_decoder_with_log_probs", "ctc_loss_v2",
        "ctc_loss_with_log_probs", "multi_conv", "nce_loss", "sampled_softmax_loss",
    ),
)


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
