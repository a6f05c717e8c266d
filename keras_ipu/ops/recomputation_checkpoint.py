"""Graphcore's `pipelining_ops.recomputation_checkpoint` for TensorFlow
code compiled through the TensorFlow front end.

Each tensor goes through an XLA custom call named
"RecomputationCheckpoint" (an identity: TensorFlow differentiates it as
one), which XLA keeps in the HLO it hands the front end; the importer maps
it to the compiler's recomputation_checkpoint marker
(device/primitives/markers.py), the one the RecomputationCheckpoint layer
binds. With recomputation on (IPUConfig.allow_recompute) and the
RecomputeAndBackpropagateInterleaved mode, the compiler keeps the value for
the backward pass and restarts recomputation from it
(device/compiler/recompute.py); in the other modes it has no effect, as
Graphcore documents. Values never change.
"""

from keras_ipu.ops import xla_custom_call

TARGET = "RecomputationCheckpoint"


@xla_custom_call.import_rule(TARGET)
def _checkpoint(imp, instr, operands, config):
    from keras_ipu.device.primitives.markers import recomputation_checkpoint_p

    (x,) = operands
    return imp.bind(recomputation_checkpoint_p, imp.array(x))


def recomputation_checkpoint(tensors, name=None):
    """Operation for checkpointing values in a computational pipeline stage
    (see the module doc). Returns tensors of the same structure, shapes and
    types."""
    import tensorflow as tf

    @tf.custom_gradient
    def checkpoint(x):
        (y,) = xla_custom_call.emit(TARGET, [x], [x.dtype], [x.shape])
        return y, lambda dy: dy

    with tf.name_scope(name or "recomputation_checkpoint"):
        return tf.nest.map_structure(
            lambda t: checkpoint(tf.convert_to_tensor(t)), tensors, expand_composites=True)
