"""Pooling on the reduce_window primitive, and adaptive pooling."""

import math

import numpy as np

from keras.src import backend as keras_backend

from keras_ipu.backend.nn_ops import _lax as lax
from keras_ipu.backend.nn_ops.convolution import spatial_tuple
from keras_ipu.device.primitives.pooling import identity
from keras_ipu.device.primitives.pooling import reduce_window

__all__ = [
    "max_pool", "average_pool", "adaptive_average_pool", "adaptive_max_pool",
]


def _full_rank(spatial, data_format, fill=1):
    """A spatial tuple widened with `fill` for the batch/channel axes."""
    if data_format == "channels_last":
        return (fill,) + spatial + (fill,)
    return (fill, fill) + spatial


def _window_args(inputs, pool_size, strides, padding, data_format):
    nsp = inputs.ndim - 2
    pool_size = spatial_tuple(pool_size, nsp, "pool_size")
    strides = pool_size if strides is None else spatial_tuple(
        strides, nsp, "strides"
    )
    mode = str(padding).lower()
    if mode not in ("valid", "same"):
        raise ValueError(
            f"Invalid padding {padding!r}: pooling takes 'valid' or 'same'."
        )
    return (
        _full_rank(pool_size, data_format),
        _full_rank(strides, data_format),
        mode.upper(),
    )


def max_pool(
    inputs,
    pool_size,
    strides=None,
    padding="valid",
    data_format=None,
):
    data_format = keras_backend.standardize_data_format(data_format)
    inputs = lax.tensor(inputs)
    window, strides, padding = _window_args(
        inputs, pool_size, strides, padding, data_format
    )
    return reduce_window(inputs, "max", window, strides, padding)


def average_pool(
    inputs,
    pool_size,
    strides=None,
    padding="valid",
    data_format=None,
):
    data_format = keras_backend.standardize_data_format(data_format)
    inputs = lax.float_tensor(inputs)
    window, strides, padding = _window_args(
        inputs, pool_size, strides, padding, data_format
    )
    sums = reduce_window(inputs, "sum", window, strides, padding)
    if padding == "VALID":
        return lax.div(sums, math.prod(window))
    # "same": padded cells are not part of the average. The count of real
    # cells per window depends on the static spatial sizes only.
    count_shape = tuple(
        d if w != 1 or s != 1 else 1
        for d, w, s in zip(inputs.shape, window, strides)
    )
    if None in count_shape:
        ones = lax.ones_like(inputs)  # traced with unknown spatial sizes
    else:
        ones = np.ones(count_shape, inputs.dtype)
    counts = reduce_window(ones, "sum", window, strides, padding)
    return lax.div(sums, counts)


def _adaptive_windows(size, out):
    """Bool (out, size) mask of PyTorch's adaptive windows:
    [floor(i * size / out), ceil((i + 1) * size / out))."""
    i = np.arange(out)
    starts = (i * size) // out
    ends = -((-(i + 1) * size) // out)
    pos = np.arange(size)
    return (pos >= starts[:, None]) & (pos < ends[:, None])


def _adaptive_pool(inputs, output_size, data_format, op):
    data_format = keras_backend.standardize_data_format(data_format)
    x = lax.tensor(inputs) if op == "max" else lax.float_tensor(inputs)
    nsp = x.ndim - 2
    if nsp not in (1, 2, 3):
        raise ValueError(
            f"adaptive pooling takes 1D, 2D or 3D inputs (rank 3 to 5); got "
            f"rank {x.ndim}."
        )
    output_size = spatial_tuple(output_size, nsp, "output_size")
    first = 1 if data_format == "channels_last" else 2
    # Pool one spatial axis at a time: a max/mean over a box is the max/mean
    # over its rows of the max/mean over its columns.
    for k, out in enumerate(output_size):
        axis = first + k
        size = x.shape[axis]
        if size is None:
            raise ValueError(
                "adaptive pooling needs known spatial sizes; got input shape "
                f"{x.shape}."
            )
        mask = _adaptive_windows(size, out)
        moved = lax.moveaxis(x, axis, -1)
        spread = lax.expand_dims(moved, -2)  # (..., 1, size)
        fill = identity("max" if op == "max" else "sum", x.dtype)
        picked = lax.select(mask, spread, lax.scalar(fill, x))
        if op == "max":
            pooled = lax.reduce_max(picked, -1)
        else:
            counts = mask.sum(axis=1).astype(x.dtype)
            pooled = lax.div(lax.reduce_sum(picked, -1), counts)
        x = lax.moveaxis(pooled, -1, axis)
    return x


def adaptive_average_pool(inputs, output_size, data_format=None):
    return _adaptive_pool(inputs, output_size, data_format, "average")


def adaptive_max_pool(inputs, output_size, data_format=None):
    return _adaptive_pool(inputs, output_size, data_format, "max")
