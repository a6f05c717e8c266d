"""A traced keras_ipu program as a TensorFlow function over tf.Variables.

    fn = emitted_function(traced, tf_variables)

`fn(*args)` emits the traced Graph as TensorFlow ops (the emitter of
keras_ipu/device/to_tensorflow) with the variables' current values as its
variable inputs, assigns the new values of the variables the program
updates, and returns the program's results in their structure. Wrapped in
a `tf.function` with an input signature it is a SavedModel endpoint.

    fn = frozen_function(traced, arrays)

The same with the variables frozen into constants of the given values (as
Graphcore's serving export freezes them); updates the program would make
are dropped.
"""

from keras.src import tree


def emitted_function(traced, tf_variables):
    """See the module doc. `tf_variables[k]` holds the value of the k-th
    variable of the trace."""
    import tensorflow as tf

    def call(*args):
        outputs = _emitted(traced, args, [v.value() for v in tf_variables])
        for k, new in zip(traced.updated, outputs[traced.n_outputs:]):
            variable = tf_variables[k]
            variable.assign(tf.cast(new, variable.dtype))
        return tree.pack_sequence_as(traced.out_structure, list(outputs[:traced.n_outputs]))

    return call


def frozen_function(traced, arrays):
    """See the module doc. `arrays[k]` is the value of the k-th variable of
    the trace."""
    import tensorflow as tf

    def call(*args):
        outputs = _emitted(traced, args, [tf.constant(a) for a in arrays])
        return tree.pack_sequence_as(traced.out_structure, list(outputs[:traced.n_outputs]))

    return call


def _emitted(traced, args, values):
    """The traced graph's outputs emitted as TensorFlow ops on the flat
    `args` and the variables' `values`."""
    import tensorflow as tf

    from keras_ipu.device.to_tensorflow import emit_graph

    flat = [tf.convert_to_tensor(x) for x in tree.flatten(args)]
    if len(flat) != traced.n_args:
        raise TypeError(
            f"The exported function takes {traced.n_args} input tensors, got {len(flat)}."
        )
    return emit_graph(traced.graph, flat + list(values))


def tensor_specs(input_signature):
    """The ArgSpec leaves of a structure of tf.TensorSpec (what
    stateless_trace.trace takes)."""
    from keras_ipu.export.stateless_trace import ArgSpec

    return tree.map_structure(
        lambda spec: ArgSpec(tuple(spec.shape.as_list()), spec.dtype.as_numpy_dtype),
        input_signature,
    )
