"""Colour-space conversions: grayscale, RGB <-> HSV (as dm_pix / tf.image)."""

import ml_dtypes
import numpy as np

from keras.src import backend as kbackend

from keras_ipu.backend.image_ops import _build as b
from keras_ipu.device.primitives import elementwise as ew
from keras_ipu.device.primitives.dot import dot_general_p

# ITU-R 601 luma weights, as tf.image.rgb_to_grayscale.
_LUMA = (0.2989, 0.5870, 0.1140)


def _channels_axis(data_format):
    data_format = kbackend.standardize_data_format(data_format)
    return -1 if data_format == "channels_last" else -3


def rgb_to_grayscale(images, data_format=None):
    images = b.tensor(images)
    axis = _channels_axis(data_format)
    b.check_images_rank(images)
    if images.shape[axis] not in (1, 3):
        raise ValueError(
            "Invalid channel size: expected 3 (RGB) or 1 (Grayscale). "
            f"Received input with shape: images.shape={images.shape}"
        )
    if images.shape[axis] == 1:
        return images
    dtype = images.dtype
    compute = b.np_dtype(b.float_compute_dtype(dtype, float))
    x = b.cast(images, compute)
    axis = axis % len(x.shape)
    gray = dot_general_p.bind(
        x,
        np.asarray(_LUMA, compute),
        dimension_numbers=(((axis,), (0,)), ((), ())),
    )
    return b.cast(b.expand_dims(gray, axis), dtype)


def _check_float(images):
    dtype = b.kdtype(images)
    if not kbackend.is_float_dtype(dtype):
        raise ValueError(
            "Invalid images dtype: expected float dtype. "
            f"Received: images.dtype={dtype}"
        )
    return dtype


def rgb_to_hsv(images, data_format=None):
    images = b.tensor(images)
    axis = _channels_axis(data_format)
    b.check_images_rank(images)
    _check_float(images)
    dtype = images.dtype
    eps = float(ml_dtypes.finfo(dtype).eps)
    # Values within eps of zero count as zero (as dm_pix does).
    tiny = b.compare(ew.lt_p, ew.abs_p.bind(images), eps)
    images = b.select(tiny, 0, images)
    r, g, bl = b.split_channels(images, axis)
    value = b.maximum(b.maximum(r, g), bl)
    minimum = b.minimum(b.minimum(r, g), bl)
    range_ = b.sub(value, minimum)
    positive_value = b.compare(ew.gt_p, value, 0)
    positive_range = b.compare(ew.gt_p, range_, 0)
    safe_value = b.select(positive_value, value, 1)
    safe_range = b.select(positive_range, range_, 1)
    saturation = b.select(positive_value, b.div(range_, safe_value), 0)
    norm = b.div(1.0, b.mul(safe_range, 6.0))
    hue = b.select(
        b.compare(ew.eq_p, value, g),
        b.add(b.mul(norm, b.sub(bl, r)), 2.0 / 6.0),
        b.add(b.mul(norm, b.sub(r, g)), 4.0 / 6.0),
    )
    hue = b.select(b.compare(ew.eq_p, value, r), b.mul(norm, b.sub(g, bl)), hue)
    wrap = b.cast(b.compare(ew.lt_p, hue, 0), dtype)
    hue = b.add(b.select(positive_range, hue, 0), wrap)
    return b.stack([hue, saturation, value], axis)


def hsv_to_rgb(images, data_format=None):
    images = b.tensor(images)
    axis = _channels_axis(data_format)
    b.check_images_rank(images)
    _check_float(images)
    hue, saturation, value = b.split_channels(images, axis)
    dh = b.mul(b.mod(hue, 1.0), 6.0)
    dr = b.clip(b.sub(ew.abs_p.bind(b.sub(dh, 3.0)), 1.0), 0.0, 1.0)
    dg = b.clip(b.sub(2.0, ew.abs_p.bind(b.sub(dh, 2.0))), 0.0, 1.0)
    db = b.clip(b.sub(2.0, ew.abs_p.bind(b.sub(dh, 4.0))), 0.0, 1.0)
    one_minus_s = b.sub(1.0, saturation)
    planes = [
        b.mul(value, b.add(one_minus_s, b.mul(saturation, d)))
        for d in (dr, dg, db)
    ]
    return b.stack(planes, axis)
