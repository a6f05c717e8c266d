"""Resizing as separable interpolation-weight matrices.

Each resized axis is one contraction (dot_general) of the image with an
(input length, output length) weight matrix, as jax.image.scale_and_translate
defines them: output sample j sits at input coordinate
(j + 0.5) / scale - translation / scale - 0.5 and takes the kernel-weighted
(optionally antialiased: kernel widened by 1/scale when shrinking),
normalised sum of the input samples. Nearest neighbour is a gather, "area"
a box-overlap matrix. The matrices are built from primitives, so scale and
translation may be tensors (traced) as well as numbers.
"""

import math

import numpy as np

from keras.src import backend as kbackend

from keras_ipu.backend.image_ops import _build as b
from keras_ipu.device.primitives import elementwise as ew
from keras_ipu.device.primitives.indexing import slice_p
from keras_ipu.device.primitives.reduce import reduce_max_p
from keras_ipu.device.primitives.reduce import reduce_min_p
from keras_ipu.device.primitives.reduce import reduce_sum_p
from keras_ipu.device.primitives.structure import pad_p

RESIZE_INTERPOLATIONS = (
    "bilinear",
    "nearest",
    "lanczos3",
    "lanczos5",
    "bicubic",
    "area",
)
SCALE_AND_TRANSLATE_METHODS = {
    "linear",
    "bilinear",
    "trilinear",
    "cubic",
    "bicubic",
    "tricubic",
    "lanczos3",
    "lanczos5",
}


# ------------------------------------------------------------------ kernels
def _triangle(x):
    return b.maximum(b.sub(1.0, x), 0.0)


def _keys_cubic(x):
    """Keys' cubic convolution kernel with a = -0.5 (as tf/jax bicubic)."""
    near = b.add(b.mul(b.mul(b.sub(b.mul(x, 1.5), 2.5), x), x), 1.0)
    far = b.add(b.mul(b.sub(b.mul(b.add(b.mul(x, -0.5), 2.5), x), 4.0), x), 2.0)
    out = b.select(b.compare(ew.ge_p, x, 1.0), far, near)
    return b.select(b.compare(ew.ge_p, x, 2.0), 0.0, out)


def _lanczos(radius):
    def kernel(x):
        y = b.mul(
            b.mul(ew.sin_p.bind(b.mul(x, math.pi)), radius),
            ew.sin_p.bind(b.mul(x, math.pi / radius)),
        )
        denom = b.mul(b.mul(x, x), math.pi**2)
        nonzero = b.compare(ew.ne_p, x, 0.0)
        out = b.div(y, b.select(nonzero, denom, 1.0))
        out = b.select(b.compare(ew.gt_p, x, 1e-3), out, 1.0)
        return b.select(b.compare(ew.gt_p, x, float(radius)), 0.0, out)

    return kernel


_KERNELS = {
    "linear": _triangle,
    "cubic": _keys_cubic,
    "lanczos3": _lanczos(3.0),
    "lanczos5": _lanczos(5.0),
}
_METHOD_ALIASES = {
    "bilinear": "linear",
    "trilinear": "linear",
    "triangle": "linear",
    "bicubic": "cubic",
    "tricubic": "cubic",
}


def weight_matrix(in_size, out_size, scale, translation, kernel, antialias, dtype):
    """(in_size, out_size) interpolation weights; scale and translation are
    scalars (numbers or 0-d tensors)."""
    dtype = b.np_dtype(dtype)
    scale = b.cast(scale, dtype)
    translation = b.cast(translation, dtype)
    inv_scale = b.div(np.asarray(1.0, dtype), scale)
    if antialias:
        kernel_scale = b.maximum(inv_scale, 1.0)
    else:
        kernel_scale = np.asarray(1.0, dtype)
    out_pos = (np.arange(out_size, dtype=dtype) + 0.5).astype(dtype)
    sample = b.sub(
        b.sub(b.mul(out_pos, inv_scale), b.mul(translation, inv_scale)), 0.5
    )
    in_pos = np.arange(in_size, dtype=dtype).reshape(in_size, 1)
    dist = ew.abs_p.bind(b.sub(b.reshape(sample, (1, out_size)), in_pos))
    weights = kernel(b.div(dist, kernel_scale))
    total = reduce_sum_p.bind(weights, axes=(0,))
    safe_total = b.select(b.compare(ew.ne_p, total, 0.0), total, 1.0)
    big_enough = b.compare(
        ew.gt_p, ew.abs_p.bind(total), 1000.0 * float(np.finfo(np.float32).eps)
    )
    weights = b.select(big_enough, b.div(weights, safe_total), 0.0)
    inside = ew.and_p.bind(
        b.compare(ew.ge_p, sample, -0.5),
        b.compare(ew.le_p, sample, in_size - 0.5),
    )
    return b.select(inside, weights, 0.0)


def _area_matrix(in_size, out_size):
    """Box overlap of each input pixel with each output pixel's footprint,
    over the footprint's width (tf.image's "area")."""
    step = in_size / out_size
    lo = np.arange(out_size) * step
    hi = lo + step
    left = np.arange(in_size)[:, None]
    overlap = np.clip(np.minimum(left + 1, hi) - np.maximum(left, lo), 0, None)
    return overlap / step


def _nearest_indices(in_size, out_size):
    offsets = (np.arange(out_size, dtype=np.float32) + 0.5) * in_size / out_size
    return np.minimum(np.floor(offsets).astype(np.int32), in_size - 1)


def _is_int(x):
    return x.dtype.kind in "iub"


def _apply_matrices(x, axes_and_matrices):
    """Contract each (axis, matrix); integer images are computed in float32
    and rounded back, saturating to the input's value range."""
    if not axes_and_matrices:
        return x
    if _is_int(x):
        out = b.cast(x, np.float32)
    else:
        out = x
    for axis, matrix in axes_and_matrices:
        out = b.contract_axis(out, b.cast(matrix, out.dtype), axis)
    if _is_int(x):
        every = tuple(range(len(x.shape)))
        lo = b.cast(reduce_min_p.bind(x, axes=every), np.float32)
        hi = b.cast(reduce_max_p.bind(x, axes=every), np.float32)
        out = b.clip(ew.round_p.bind(out), lo, hi)
        out = b.cast(out, x.dtype)
    return out


def _resize_axes(images, spatial, sizes, method, antialias):
    pairs = []
    for axis, n in zip(spatial, sizes):
        m = images.shape[axis]
        if m is None:
            raise ValueError(
                f"resize needs the spatial dimensions of the images; axis "
                f"{axis} of {images.shape} is unknown (None). Give the model "
                "a fixed input height and width."
            )
        if m != n:
            pairs.append((axis, m, n))
    if method == "nearest":
        for axis, m, n in pairs:
            images = b.take_axis(images, _nearest_indices(m, n), axis)
        return images
    matrices = []
    for axis, m, n in pairs:
        if method == "area":
            w = _area_matrix(m, n)
        else:
            kernel = _KERNELS[_METHOD_ALIASES.get(method, method)]
            w = weight_matrix(m, n, n / m, 0.0, kernel, antialias, np.float64)
        matrices.append((axis, w))
    return _apply_matrices(images, matrices)


def _crop(images, h_axis, target_height, target_width):
    height, width = images.shape[h_axis], images.shape[h_axis + 1]
    crop_height = int(float(width * target_height) / target_width)
    crop_height = max(min(height, crop_height), 1)
    crop_width = int(float(height * target_width) / target_height)
    crop_width = max(min(width, crop_width), 1)
    top = int(float(height - crop_height) / 2)
    left = int(float(width - crop_width) / 2)
    images = b.slice_axis(images, h_axis, top, top + crop_height)
    return b.slice_axis(images, h_axis + 1, left, left + crop_width)


def _pad(images, h_axis, target_height, target_width, fill_value):
    height, width = images.shape[h_axis], images.shape[h_axis + 1]
    pad_height = max(height, int(float(width * target_height) / target_width))
    pad_width = max(width, int(float(height * target_width) / target_height))
    top = int(float(pad_height - height) / 2)
    left = int(float(pad_width - width) / 2)
    # As Keras' other backends: pad one pair of sides, height first.
    if top > 0:
        pads = {h_axis: (top, top)}
    elif left > 0:
        pads = {h_axis + 1: (left, left)}
    else:
        return images
    config = tuple(
        pads.get(i, (0, 0)) + (0,) for i in range(len(images.shape))
    )
    value = np.asarray(fill_value, images.dtype)
    return pad_p.bind(images, value, config=config)


def resize(
    images,
    size,
    interpolation="bilinear",
    antialias=False,
    crop_to_aspect_ratio=False,
    pad_to_aspect_ratio=False,
    fill_mode="constant",
    fill_value=0.0,
    data_format=None,
):
    data_format = kbackend.standardize_data_format(data_format)
    if interpolation not in RESIZE_INTERPOLATIONS:
        raise ValueError(
            "Invalid value for argument `interpolation`. Expected of one "
            f"{RESIZE_INTERPOLATIONS}. Received: interpolation={interpolation}"
        )
    if fill_mode != "constant":
        raise ValueError(
            "Invalid value for argument `fill_mode`. Only `'constant'` "
            f"is supported. Received: fill_mode={fill_mode}"
        )
    if pad_to_aspect_ratio and crop_to_aspect_ratio:
        raise ValueError(
            "Only one of `pad_to_aspect_ratio` & `crop_to_aspect_ratio` "
            "can be `True`."
        )
    if not len(size) == 2:
        raise ValueError(
            "Argument `size` must be a tuple of two elements "
            f"(height, width). Received: size={size}"
        )
    target_height, target_width = (int(s) for s in size)
    images = b.tensor(images)
    ndim = len(images.shape)
    b.check_images_rank(images)
    h_axis = ndim - 3 if data_format == "channels_last" else ndim - 2
    if crop_to_aspect_ratio:
        images = _crop(images, h_axis, target_height, target_width)
    elif pad_to_aspect_ratio:
        images = _pad(images, h_axis, target_height, target_width, fill_value)
    return _resize_axes(
        images,
        (h_axis, h_axis + 1),
        (target_height, target_width),
        interpolation,
        antialias,
    )


def _scalar_at(values, i, dtype):
    """Element i of a 1-D parameter (numbers or a tensor) as a 0-d operand."""
    if b.is_array(values):
        piece = slice_p.bind(
            values, start_indices=(i,), limit_indices=(i + 1,), strides=(1,)
        )
        return b.cast(b.reshape(piece, ()), dtype)
    return np.asarray(np.asarray(values).reshape(-1)[i], dtype)


def scale_and_translate(
    images,
    output_shape,
    scale,
    translation,
    spatial_dims,
    method,
    antialias=True,
):
    if method not in SCALE_AND_TRANSLATE_METHODS:
        raise ValueError(
            "Invalid value for argument `method`. Expected of one "
            f"{SCALE_AND_TRANSLATE_METHODS}. Received: method={method}"
        )
    kernel = _KERNELS[_METHOD_ALIASES.get(method, method)]
    images = b.tensor(images)
    if not b.is_array(scale):
        scale = np.asarray(scale)
    if not b.is_array(translation):
        translation = np.asarray(translation)
    from keras.src.backend.common import dtypes

    dtype = b.np_dtype(dtypes.result_type(b.kdtype(scale), b.kdtype(translation)))
    out_dtype = np.dtype(np.float32) if _is_int(images) else images.dtype
    matrices = []
    for i, axis in enumerate(spatial_dims):
        axis = axis % len(images.shape)
        m, n = images.shape[axis], output_shape[axis]
        if m is None:
            raise ValueError(
                f"scale_and_translate needs static spatial dimensions; axis "
                f"{axis} of {images.shape} is unknown (None)."
            )
        w = weight_matrix(
            m,
            n,
            _scalar_at(scale, i, dtype),
            _scalar_at(translation, i, dtype),
            kernel,
            antialias,
            dtype,
        )
        matrices.append((axis, b.cast(w, out_dtype)))
    return _apply_matrices(images, matrices)
