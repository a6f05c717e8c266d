"""keras_ipu.ops.control_flow_ops: Control flow operations. (Graphcore's
`tensorflow.python.ipu.ops.control_flow_ops`, also `keras_ipu.control_flow_ops`)."""


def barrier(tensors, insert_barrier_for_gradients=False, name=None):
    """`tensors` (a structure) returned through one barrier: nothing that
    reads an output can run before every input is computed. This is XLA's
    optimization barrier (opt-barrier), which the TensorFlow front end
    imports as a copy of its operands; the values pass unchanged.
    `insert_barrier_for_gradients` puts a barrier on the gradients of the
    outputs too."""
    import tensorflow as tf
    from tensorflow.compiler.tf2xla.ops import gen_xla_ops

    flat = [tf.convert_to_tensor(t) for t in tf.nest.flatten(tensors)]

    @tf.custom_gradient
    def through_barrier(*xs):
        def grad(*dys):
            if insert_barrier_for_gradients:
                return list(gen_xla_ops.xla_optimization_barrier(list(dys)))
            return list(dys)

        return list(gen_xla_ops.xla_optimization_barrier(list(xs), name=name)), grad

    return tf.nest.pack_sequence_as(tensors, through_barrier(*flat))
