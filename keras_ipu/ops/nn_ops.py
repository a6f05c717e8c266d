"""keras_ipu.ops.nn_ops: Popnn primitive neural network operators. (Graphcore's
`tensorflow.python.ipu.ops.nn_ops`, also `keras_ipu.nn_ops`)."""

from keras_ipu._unavailable import unavailable_class
from keras_ipu._unavailable import unavailable_function

_PLANNED = "not implemented yet (issue 12)."

ctc_beam_search_decoder = unavailable_function("nn_ops.ctc_beam_search_decoder", _PLANNED)
ctc_beam_search_decoder_with_log_probs = unavailable_function("nn_ops.ctc_beam_search_decoder_with_log_probs", _PLANNED)
ctc_loss_v2 = unavailable_function("nn_ops.ctc_loss_v2", _PLANNED)
ctc_loss_with_log_probs = unavailable_function("nn_ops.ctc_loss_with_log_probs", _PLANNED)
gelu = unavailable_function("nn_ops.gelu", _PLANNED)
hard_sigmoid = unavailable_function("nn_ops.hard_sigmoid", _PLANNED)
multi_conv = unavailable_function("nn_ops.multi_conv", _PLANNED)
nce_loss = unavailable_function("nn_ops.nce_loss", _PLANNED)
sampled_softmax_loss = unavailable_function("nn_ops.sampled_softmax_loss", _PLANNED)
softmax = unavailable_function("nn_ops.softmax", _PLANNED)
swish = unavailable_function("nn_ops.swish", _PLANNED)
