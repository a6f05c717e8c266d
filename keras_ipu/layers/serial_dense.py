"""SerialDense: a Dense layer whose matrix product is broken into smaller
products (Graphcore's `math_ops.serialized_matmul`).

Given inputs [..., m, k] and a kernel [k, n], the product is serialized
along m (`input_columns`), along k (`input_rows_kernel_columns`: the slice
products are summed in order) or along n (`kernel_rows`), as Graphcore's
op builds it: serialization_factor products of slices, joined by a
concatenation or a sum. Their gradients are products of slices too, so
the backward pass is serialized as well (Graphcore writes that gradient by
hand; here it is what differentiating the slices gives).

On the IPU this lowers the code and working memory of the product. The
simulator's memory model counts tensors, not a matmul's working memory
(partial sums, operands rearranged for the plan), so it does not predict
that saving: a serialized program holds the same output plus its slices.
"""

import keras
from keras import ops

from keras_ipu.layers._base import serializable


def _slices(x, axis, factor):
    """x cut into `factor` equal slices along `axis`."""
    size = x.shape[axis] // factor
    index = [slice(None)] * len(x.shape)
    slices = []
    for i in range(factor):
        index[axis] = slice(i * size, (i + 1) * size)
        slices.append(x[tuple(index)])
    return slices


def serialized_matmul(a, b, serialization_factor, serialization_dimension):
    """a @ b for a [..., m, k] and a 2-D b [k, n], as serialization_factor
    products of slices of m ("a_columns"), k ("a_rows_b_columns") or n
    ("b_rows"), Graphcore's names."""
    factor = int(serialization_factor)
    if factor < 1:
        raise ValueError(
            f"serialization_factor has to be at least 1, but was {factor}.")
    if len(a.shape) < 2:
        raise ValueError("Expected tensor 'a' to have a minimum rank of 2")
    if len(b.shape) < 2:
        raise ValueError("Expected tensor 'b' to have a minimum rank of 2")
    if serialization_dimension == "a_columns":
        m = a.shape[-2]
        if m is not None and m % factor:
            raise ValueError(
                f"Expected 'serialization_factor' ({factor}) to divide the "
                f"columns dimension of 'a' ({m}).")
        return ops.concatenate(
            [ops.matmul(s, b) for s in _slices(a, -2, factor)], axis=-2)
    if serialization_dimension == "a_rows_b_columns":
        k = a.shape[-1]
        if k != b.shape[-2]:
            raise ValueError(
                f"Expected the number of columns in 'a' ({k}) to match the "
                f"number of rows in 'b' ({b.shape[-2]}).")
        if k % factor:
            raise ValueError(
                f"Expected 'serialization_factor' ({factor}) to divide the rows "
                f"dimension of 'a' ({k}).")
        result = None
        for a_i, b_i in zip(_slices(a, -1, factor), _slices(b, -2, factor)):
            product = ops.matmul(a_i, b_i)
            result = product if result is None else result + product
        return result
    if serialization_dimension == "b_rows":
        n = b.shape[-1]
        if n % factor:
            raise ValueError(
                f"Expected 'serialization_factor' ({factor}) to divide the rows "
                f"dimension of 'b' ({n}).")
        return ops.concatenate(
            [ops.matmul(a, s) for s in _slices(b, -1, factor)], axis=-1)
    raise ValueError(
        f"Invalid serialization_dimension={serialization_dimension}, expected one "
        "of: 'a_columns', 'a_rows_b_columns', 'b_rows'.")


_GRAPHCORE_NAMES = {
    "input_columns": "a_columns",
    "input_rows_kernel_columns": "a_rows_b_columns",
    "kernel_rows": "b_rows",
}


@serializable
class SerialDense(keras.layers.Layer):
    """Densely-connected layer whose matrix product is serialized:
    `activation(serialized_matmul(inputs, kernel) + bias)`, the values of
    keras.layers.Dense with the same weights.

    Args:
      units: the output size.
      serialization_factor: into how many smaller products the product is
        broken (must divide the serialized dimension).
      serialization_dimension: "input_columns" (the inputs' second to last
        dimension m), "input_rows_kernel_columns" (the inner dimension k)
        or "kernel_rows" (the output dimension n).
      activation, use_bias, the initializers, regularizers and constraints:
        as keras.layers.Dense.
    """

    def __init__(self, units, serialization_factor, serialization_dimension,
                 activation=None, use_bias=True,
                 kernel_initializer="glorot_uniform", bias_initializer="zeros",
                 kernel_regularizer=None, bias_regularizer=None,
                 activity_regularizer=None, kernel_constraint=None,
                 bias_constraint=None, **kwargs):
        if "input_shape" not in kwargs and "input_dim" in kwargs:
            kwargs["input_shape"] = (kwargs.pop("input_dim"),)
        kwargs.pop("input_shape", None)  # Keras 3 takes shapes from keras.Input
        super().__init__(activity_regularizer=activity_regularizer, **kwargs)
        self.units = int(units)
        self.serialization_factor = int(serialization_factor)
        self.serialization_dimension = serialization_dimension
        self.activation = keras.activations.get(activation)
        self.use_bias = use_bias
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.kernel_regularizer = keras.regularizers.get(kernel_regularizer)
        self.bias_regularizer = keras.regularizers.get(bias_regularizer)
        self.kernel_constraint = keras.constraints.get(kernel_constraint)
        self.bias_constraint = keras.constraints.get(bias_constraint)
        self.input_spec = keras.layers.InputSpec(min_ndim=2)
        self.supports_masking = True

    def build(self, input_shape):
        dtype = keras.backend.standardize_dtype(self.dtype_policy.variable_dtype)
        if "float" not in dtype and "complex" not in dtype:
            raise TypeError(
                "Unable to build `SerialDense` layer with non-floating point "
                f"dtype {dtype}")
        last = input_shape[-1]
        if last is None:
            raise ValueError(
                "The last dimension of the inputs to `SerialDense` should be "
                "defined. Found `None`.")
        self.input_spec = keras.layers.InputSpec(min_ndim=2, axes={-1: last})
        self.kernel = self.add_weight(
            name="kernel", shape=(last, self.units),
            initializer=self.kernel_initializer,
            regularizer=self.kernel_regularizer,
            constraint=self.kernel_constraint)
        self.bias = None
        if self.use_bias:
            self.bias = self.add_weight(
                name="bias", shape=(self.units,), initializer=self.bias_initializer,
                regularizer=self.bias_regularizer, constraint=self.bias_constraint)

    def call(self, inputs):
        if self.serialization_factor < 1:
            raise ValueError(
                "serialization_factor has to be at least 1, but was "
                f"{self.serialization_factor}.")
        dimension = _GRAPHCORE_NAMES.get(self.serialization_dimension)
        if dimension is None:
            raise ValueError(
                f"Invalid serialization_dimension={self.serialization_dimension}, "
                "expected one of: 'input_columns', 'input_rows_kernel_columns', "
                "'kernel_rows'.")
        outputs = serialized_matmul(ops.cast(inputs, self.compute_dtype), self.kernel,
                                    self.serialization_factor, dimension)
        if self.bias is not None:
            outputs = ops.add(outputs, self.bias)
        if self.activation is not None:
            outputs = self.activation(outputs)
        return outputs

    def compute_output_shape(self, input_shape):
        if input_shape[-1] is None:
            raise ValueError(
                "The innermost dimension of input_shape must be defined, but "
                f"saw: {input_shape}")
        return tuple(input_shape[:-1]) + (self.units,)

    def get_config(self):
        return {
            **super().get_config(),
            "units": self.units,
            "serialization_factor": self.serialization_factor,
            "serialization_dimension": self.serialization_dimension,
            "activation": keras.activations.serialize(self.activation),
            "use_bias": self.use_bias,
            "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
            "bias_initializer": keras.initializers.serialize(self.bias_initializer),
            "kernel_regularizer": keras.regularizers.serialize(self.kernel_regularizer),
            "bias_regularizer": keras.regularizers.serialize(self.bias_regularizer),
            "kernel_constraint": keras.constraints.serialize(self.kernel_constraint),
            "bias_constraint": keras.constraints.serialize(self.bias_constraint),
        }
