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

TARGET = "RecomputationCheckpoint"
_registered = []


def _register_import_rule():
    """The importer's rule for the custom call (registered once, when the
    first checkpoint is made: only programs that hold one need it)."""
    if _registered:
        return
    from keras_ipu.device.primitives.markers import recomputation_checkpoint_p
    from keras_ipu.frontends.tensorflow.opcodes.linalg import register_custom_call

    @register_custom_call(TARGET)
    def _checkpoint(imp, instr, operands):
        (x,) = operands
        return imp.bind(recomputation_checkpoint_p, imp.array(x))

    _registered.append(True)


def recomputation_checkpoint(tensors, name=None):
    """Operation for checkpointing values in a computational pipeline stage
    (see the module doc). Returns tensors of the same structure, shapes and
    types."""
    import tensorflow as tf
    from tensorflow.compiler.tf2xla.ops import gen_xla_ops

    _register_import_rule()

    @tf.custom_gradient
    def checkpoint(x):
        y = gen_xla_ops.xla_custom_call_v2(
            [x], call_target_name=TARGET, backend_config="", has_side_effect=False,
            result_dtypes=[x.dtype], result_shapes=[x.shape])[0]
        return y, lambda dy: dy

    with tf.name_scope(name or "recomputation_checkpoint"):
        return tf.nest.map_structure(
            lambda t: checkpoint(tf.convert_to_tensor(t)), tensors, expand_composites=True)
