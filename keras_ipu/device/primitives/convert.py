"""Dtype conversion primitives."""

import numpy as np

from keras_ipu.device.ir import ShapedArray
from keras_ipu.device.primitives.registry import Primitive


def _convert_rule(x, *, dtype):
    return ShapedArray(x.shape, dtype)


def _convert(x, *, dtype):
    dtype = np.dtype(dtype)
    if x.dtype == dtype:
        return x
    if dtype.kind in "iu" and x.dtype.kind == "f":
        # Float to int truncates toward zero, NaN becomes 0, as on the
        # device's conversion instructions (NumPy leaves it undefined).
        x = np.nan_to_num(np.trunc(x), nan=0.0)
        info = np.iinfo(dtype)
        with np.errstate(invalid="ignore"):
            x = np.clip(x, info.min, info.max)
    if dtype.kind == "b":
        return x != 0
    with np.errstate(invalid="ignore", over="ignore"):
        return x.astype(dtype)


convert_element_type_p = Primitive(
    "convert_element_type", _convert_rule, _convert
)


def _bitcast_rule(x, *, dtype):
    dtype = np.dtype(dtype)
    if dtype.itemsize != x.dtype.itemsize:
        ratio = x.dtype.itemsize / dtype.itemsize
        if ratio > 1:
            return ShapedArray(x.shape + (int(ratio),), dtype)
        if x.shape and x.shape[-1] not in (None, int(1 / ratio)):
            raise ValueError(
                f"bitcast from {x.dtype} to {dtype} needs a last dimension "
                f"of {int(1 / ratio)}, got shape {x.shape}"
            )
        return ShapedArray(x.shape[:-1], dtype)
    return ShapedArray(x.shape, dtype)


def _bitcast(x, *, dtype):
    dtype = np.dtype(dtype)
    x = np.ascontiguousarray(x)
    if dtype.itemsize == x.dtype.itemsize:
        return x.view(dtype)
    if dtype.itemsize < x.dtype.itemsize:
        return x.view(dtype).reshape(x.shape + (x.dtype.itemsize // dtype.itemsize,))
    return x.view(dtype).reshape(x.shape[:-1])


bitcast_convert_type_p = Primitive(
    "bitcast_convert_type", _bitcast_rule, _bitcast, nondiff="reinterprets bits"
)
