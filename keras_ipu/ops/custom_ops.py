"""keras_ipu.ops.custom_ops: Custom operations. (Graphcore's
`tensorflow.python.ipu.ops.custom_ops`, also `keras_ipu.custom_ops`).

`codelet_expression_op` is an elementwise expression that Graphcore lowers
to one Poplar codelet; here the expression is applied to the tensors as
TensorFlow operations, which the front end compiles (the device compiler
fuses elementwise chains itself). The user operations load Poplar or host
libraries built against Graphcore's C++ API, which cannot exist here.
"""

from keras_ipu._unavailable import unavailable_function

cpu_user_operation = unavailable_function(
    "custom_ops.cpu_user_operation",
    "its shared library is C++ written against Graphcore's interface for host "
    "operations, which keras_ipu has no binding to load or call; write the "
    "operation with TensorFlow ops.")
precompiled_user_op = unavailable_function(
    "custom_ops.precompiled_user_op",
    "its library builds Poplar graph programs (and its .gp file holds Poplar "
    "codelets for the IPU's tiles); keras_ipu has no Poplar graph for it to "
    "build into; write the operation with TensorFlow ops.")


def codelet_expression_op(vertex_expression, *args):
    """Add a custom fused elementwise expression operation: the value of
    `vertex_expression(*args)` (a Python function of the inputs written
    with the operators Graphcore supports, +, -, * and abs, such as
    `lambda x, y, z: x * x + y * z`), of the first input's dtype. As Graphcore's, it has no gradient: differentiating
    through it raises LookupError."""
    import tensorflow as tf

    if not args:
        raise ValueError("codelet_expression_op needs at least one input tensor.")
    tensors = [tf.convert_to_tensor(a) for a in args]
    dtype = tensors[0].dtype

    @tf.custom_gradient
    def fused(*inputs):
        def grad(*dys):
            raise LookupError(
                "codelet_expression_op has no gradient: the automatic gradient "
                "calculation does not see the operations of the expression (as "
                "Graphcore's); write the expression with TensorFlow ops to train it.")

        return tf.cast(vertex_expression(*inputs), dtype), grad

    return fused(*tensors)
