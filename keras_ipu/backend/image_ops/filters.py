"""Image filters as depthwise convolutions: Gaussian blur and Sobel edges."""

import numpy as np

from keras.src import backend as kbackend

from keras_ipu.backend.image_ops import _build as b
from keras_ipu.device.primitives import elementwise as ew
from keras_ipu.device.primitives.conv import conv_general_dilated_p
from keras_ipu.device.primitives.reduce import reduce_sum_p


# NHWC input, HWIO kernel, NHWC output.
_NHWC = ((0, 3, 1, 2), (3, 2, 0, 1), (0, 3, 1, 2))


def _depthwise(images, kernel, padding, channels):
    """images NHWC, kernel (kh, kw, 1, channels * k) -> NHWC with
    channels * k features: each input channel its own k filters."""
    return conv_general_dilated_p.bind(
        images,
        b.cast(kernel, images.dtype),
        window_strides=(1, 1),
        padding=tuple(tuple(p) for p in padding),
        lhs_dilation=(1, 1),
        rhs_dilation=(1, 1),
        dimension_numbers=_NHWC,
        feature_group_count=channels,
    )


def _gaussian_1d(size, sigma, dtype):
    """Normalised Gaussian taps of a static length; sigma may be a tensor."""
    x = np.arange(size, dtype=dtype) - (size - 1) / 2
    z = b.div(x, sigma)
    taps = ew.exp_p.bind(b.mul(b.mul(z, z), -0.5))
    return b.div(taps, reduce_sum_p.bind(taps, axes=(0,)))


def _static_int_pair(value, name):
    if b.is_array(value):
        value = kbackend.convert_to_numpy(value)
    value = np.asarray(value).reshape(-1)
    if value.size != 2:
        raise ValueError(f"`{name}` must hold two values, got {value!r}.")
    return int(value[0]), int(value[1])


def _sigma_pair(sigma, dtype):
    if b.is_array(sigma):
        sigma = b.cast(b.reshape(sigma, (-1,)), dtype)
        if sigma.shape[0] == 1:
            return sigma, sigma
        first = b.reshape(b.slice_axis(sigma, 0, 0, 1), ())
        second = b.reshape(b.slice_axis(sigma, 0, 1, 2), ())
        return first, second
    values = np.asarray(sigma, dtype).reshape(-1)
    if values.size == 1:
        values = np.repeat(values, 2)
    return values[0], values[1]


def blur_nhwc(images, sizes, sigmas):
    """Separable Gaussian blur of an NHWC tensor: sizes and sigmas are
    (along height, along width); zero padding, an even kernel's extra tap
    after the centre (as Keras' other backends)."""
    channels = images.shape[-1]
    dtype = images.dtype
    out = images
    for axis, size, sigma in ((1, sizes[0], sigmas[0]), (2, sizes[1], sigmas[1])):
        taps = _gaussian_1d(size, sigma, dtype)
        shape = (size, 1, 1, 1) if axis == 1 else (1, size, 1, 1)
        kernel = b.add(b.reshape(taps, shape), np.zeros((1, 1, 1, channels), dtype))
        before = (size - 1) // 2
        pads = [(0, 0), (0, 0)]
        pads[axis - 1] = (before, size - 1 - before)
        out = _depthwise(out, kernel, pads, channels)
    return out


def gaussian_blur(images, kernel_size=(3, 3), sigma=(1.0, 1.0), data_format=None):
    data_format = kbackend.standardize_data_format(data_format)
    images = b.tensor(images)
    b.check_images_rank(images)
    input_dtype = images.dtype
    compute = b.np_dtype(b.float_compute_dtype(b.kdtype(images), "float32"))
    images = b.cast(images, compute)
    need_squeeze = len(images.shape) == 3
    if need_squeeze:
        images = b.expand_dims(images, 0)
    if data_format == "channels_first":
        images = b.transpose(images, (0, 2, 3, 1))
    channels = images.shape[-1]
    if channels is None:
        raise ValueError(
            f"gaussian_blur needs the number of channels; got {images.shape}."
        )
    # As Keras' other backends: the first size/sigma pair runs along the
    # width, the second along the height.
    size_x, size_y = _static_int_pair(kernel_size, "kernel_size")
    sigma_x, sigma_y = _sigma_pair(sigma, compute)
    out = blur_nhwc(images, (size_y, size_x), (sigma_y, sigma_x))
    if data_format == "channels_first":
        out = b.transpose(out, (0, 3, 1, 2))
    if need_squeeze:
        out = b.squeeze(out, 0)
    return b.cast(out, input_dtype)


# scipy.ndimage.sobel: a [-1, 0, 1] difference along one axis, [1, 2, 1]
# smoothing along the other, edges extended by reflection.
_DIFF = np.array([-1.0, 0.0, 1.0])
_SMOOTH = np.array([1.0, 2.0, 1.0])


def sobel_edges(images, data_format=None):
    data_format = kbackend.standardize_data_format(data_format)
    images = b.tensor(images)
    if len(images.shape) != 4:
        raise ValueError(
            "Invalid images rank: expected rank 4 (batch of images). "
            f"Received input with shape: images.shape={images.shape}"
        )
    if data_format == "channels_first":
        images = b.transpose(images, (0, 2, 3, 1))
    batch, height, width, channels = images.shape
    if channels is None:
        raise ValueError(
            f"sobel_edges needs the number of channels; got {images.shape}."
        )
    dtype = images.dtype
    compute = dtype if dtype.kind == "f" else np.dtype(np.float32)
    x = b.cast(images, compute)
    # A one-pixel reflection ("reflect" in scipy) repeats the edge pixel.
    x = _edge_pad(x, 1)
    dy = np.outer(_DIFF, _SMOOTH)
    dx = np.outer(_SMOOTH, _DIFF)
    pair = np.stack([dy, dx], axis=-1)  # (3, 3, 2)
    kernel = np.tile(pair[:, :, None, None, :], (1, 1, 1, channels, 1))
    kernel = kernel.reshape(3, 3, 1, channels * 2).astype(compute)
    out = _depthwise(x, kernel, ((0, 0), (0, 0)), channels)
    out = b.reshape(out, (batch, height, width, channels, 2))
    if data_format == "channels_first":
        out = b.transpose(out, (0, 3, 1, 2, 4))
    return b.cast(out, dtype)


def _edge_pad(x, width):
    """Pad H and W of an NHWC tensor by repeating the edge pixels."""
    for axis in (1, 2):
        first = b.slice_axis(x, axis, 0, 1)
        last = b.slice_axis(x, axis, -1, None)
        x = b.concatenate([first] * width + [x] + [last] * width, axis)
    return x



