"""Convolutions in Keras' conventions, on the conv_general_dilated
primitive.

Keras kernels are (*spatial, in_channels, out_channels) for conv and
(*spatial, out_channels, in_channels) for conv_transpose; inputs are
channels_last (N, *spatial, C) or channels_first (N, C, *spatial).
"""

from keras.src import backend as keras_backend
from keras.src.backend.common.backend_utils import check_conv_input_channels
from keras.src.backend.common.backend_utils import (
    check_conv_transpose_input_channels,
)
from keras.src.backend.common.backend_utils import (
    compute_conv_transpose_padding_args_for_jax,
)

from keras_ipu.backend.nn_ops import _lax as lax
from keras_ipu.device.primitives import conv as conv_prims

__all__ = ["conv", "depthwise_conv", "separable_conv", "conv_transpose"]


def spatial_tuple(value, n, name):
    if isinstance(value, int):
        return (value,) * n
    value = tuple(int(v) for v in value)
    if len(value) == 1 and n > 1:
        value = value * n
    if len(value) != n:
        raise ValueError(
            f"`{name}` must be an int or a tuple of {n} ints (one per spatial "
            f"dimension). Received: {name}={value}"
        )
    return value


def dimension_numbers(ndim, data_format):
    """lax-style layouts for a Keras input and a (*spatial, I, O) kernel."""
    spatial = tuple(range(1, ndim - 1))
    if data_format == "channels_last":
        lhs = (0, ndim - 1) + spatial
    else:
        lhs = (0, 1) + tuple(range(2, ndim))
    rhs = (ndim - 1, ndim - 2) + tuple(range(ndim - 2))
    return (lhs, rhs, lhs)


def _padding(padding):
    mode = str(padding).lower()
    if mode not in ("valid", "same"):
        raise ValueError(
            f"Invalid padding {padding!r}: conv ops take 'valid' or 'same' "
            "('causal' is applied by the Conv1D layer before the op)."
        )
    return mode.upper()


def _check_not_empty(out, inputs):
    if any(d == 0 for d in out.shape) and all(
        d is not None and d > 0 for d in inputs.shape
    ):
        raise ValueError(
            "The convolution operation resulted in an empty output: the "
            f"input of shape {tuple(inputs.shape)} is too small for the "
            "kernel size, strides, dilation rate and padding. Use a larger "
            "input, 'same' padding, or a smaller kernel/stride."
        )
    return out


def _grouped_conv(inputs, kernel, strides, padding, data_format, dilation_rate,
                  groups):
    """conv_general_dilated with Keras' conv arguments and `groups` feature
    groups; a too-small input is an error, as in Keras' other backends."""
    nsp = inputs.ndim - 2
    out = conv_prims.conv_general_dilated(
        inputs,
        kernel,
        window_strides=spatial_tuple(strides, nsp, "strides"),
        padding=_padding(padding),
        rhs_dilation=spatial_tuple(dilation_rate, nsp, "dilation_rate"),
        dimension_numbers=dimension_numbers(inputs.ndim, data_format),
        feature_group_count=groups,
    )
    return _check_not_empty(out, inputs)


def conv(
    inputs,
    kernel,
    strides=1,
    padding="valid",
    data_format=None,
    dilation_rate=1,
):
    data_format = keras_backend.standardize_data_format(data_format)
    inputs, kernel = lax.promote(inputs, kernel)
    channels = inputs.shape[-1 if data_format == "channels_last" else 1]
    kernel_in = kernel.shape[-2]
    groups = 1
    if channels is not None and kernel_in is not None:
        if kernel_in == 0 or channels % kernel_in:
            raise ValueError(
                "The number of input channels must be evenly divisible by "
                f"kernel's in_channels. Received input channels {channels} "
                f"and kernel in_channels {kernel_in}. Use a kernel whose "
                "in_channels divides the input channels (groups = ratio)."
            )
        groups = channels // kernel_in
    return _grouped_conv(
        inputs, kernel, strides, padding, data_format, dilation_rate, groups
    )


def depthwise_conv(
    inputs,
    kernel,
    strides=1,
    padding="valid",
    data_format=None,
    dilation_rate=1,
):
    data_format = keras_backend.standardize_data_format(data_format)
    inputs, kernel = lax.promote(inputs, kernel)
    check_conv_input_channels(inputs, kernel, data_format)
    # (*spatial, C, multiplier) -> (*spatial, 1, C * multiplier), C groups.
    channels, multiplier = kernel.shape[-2], kernel.shape[-1]
    kernel = lax.reshape(kernel, tuple(kernel.shape[:-2]) + (1, channels * multiplier))
    return _grouped_conv(
        inputs, kernel, strides, padding, data_format, dilation_rate, channels
    )


def separable_conv(
    inputs,
    depthwise_kernel,
    pointwise_kernel,
    strides=1,
    padding="valid",
    data_format=None,
    dilation_rate=1,
):
    data_format = keras_backend.standardize_data_format(data_format)
    inputs, depthwise_kernel, pointwise_kernel = lax.promote(
        inputs, depthwise_kernel, pointwise_kernel
    )
    check_conv_input_channels(inputs, depthwise_kernel, data_format)
    depthwise = depthwise_conv(
        inputs, depthwise_kernel, strides, padding, data_format, dilation_rate
    )
    return conv(depthwise, pointwise_kernel, 1, "valid", data_format, 1)


def conv_transpose(
    inputs,
    kernel,
    strides=1,
    padding="valid",
    output_padding=None,
    data_format=None,
    dilation_rate=1,
):
    from keras_ipu.backend import numpy as knp

    data_format = keras_backend.standardize_data_format(data_format)
    inputs, kernel = lax.promote(inputs, kernel)
    check_conv_transpose_input_channels(inputs, kernel, data_format)
    nsp = inputs.ndim - 2
    pads = compute_conv_transpose_padding_args_for_jax(
        input_shape=inputs.shape,
        kernel_shape=kernel.shape,
        strides=strides,
        padding=padding,
        output_padding=output_padding,
        dilation_rate=dilation_rate,
    )
    # The gradient of a conv: spatially flipped kernel whose in/out roles
    # are swapped, run over the stride-dilated input.
    kernel = knp.flip(kernel, axis=tuple(range(nsp)))
    lhs_spec, _, out_spec = dimension_numbers(inputs.ndim, data_format)
    rhs_spec = (inputs.ndim - 2, inputs.ndim - 1) + tuple(range(nsp))
    return conv_prims.conv_transpose(
        inputs,
        kernel,
        strides=spatial_tuple(strides, nsp, "strides"),
        padding=tuple(tuple(p) for p in pads),
        rhs_dilation=spatial_tuple(dilation_rate, nsp, "dilation_rate"),
        dimension_numbers=(lhs_spec, rhs_spec, out_spec),
    )
