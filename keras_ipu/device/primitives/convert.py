"""Dtype conversion primitives.

Gradient rules: grads/convert.py (registered once every primitive exists).
"""

import numpy as np

from keras_ipu.device.ir import ShapedArray
from keras_ipu.device.primitives import cost_util as _cost
from keras_ipu.device.primitives.registry import Primitive


def _convert_rule(x, *, dtype):
    return ShapedArray(x.shape, dtype)


def _convert(x, *, dtype):
    dtype = np.dtype(dtype)
    if x.dtype == dtype:
        return x
    if x.dtype.kind == "c" and dtype.kind != "c":
        # Complex to real keeps the real part (as lax.convert_element_type),
        # without NumPy's ComplexWarning.
        x = x.real
    if dtype.kind in "iu" and x.dtype.kind == "f":
        # Float to int truncates toward zero, saturates, and NaN becomes 0,
        # as the device's conversion instructions do (NumPy leaves it
        # undefined). float64 holds every int32 bound exactly.
        info = np.iinfo(dtype)
        with np.errstate(invalid="ignore"):
            x = np.trunc(x)
            # Python float against Python int compares exactly (a NumPy
            # float32 would round the bound: 2**31 - 1 becomes 2**31).
            if x.size and info.min <= float(x.min()) and float(x.max()) <= info.max:
                # Finite and in range (a NaN fails both tests): the cast is
                # exact. The common case (labels, indices) skips the rest.
                return x.astype(dtype)
            x = np.nan_to_num(x.astype(np.float64), nan=0.0)
            x = np.clip(x, float(info.min), float(info.max))
    if dtype.kind == "b":
        return x != 0
    with np.errstate(invalid="ignore", over="ignore"):
        return x.astype(dtype)


convert_element_type_p = Primitive(
    "convert_element_type", _convert_rule, _convert,
    elementwise=True, ieee_exact=True, fp_class="convert",
)


def _view_rule(x, dtype):
    """NumPy's `ndarray.view(dtype)`: the last axis is rescaled by the
    itemsize ratio instead of gaining or losing an axis."""
    old, new = x.dtype.itemsize, dtype.itemsize
    if old == new:
        return ShapedArray(x.shape, dtype)
    if not x.shape:
        raise ValueError(
            f"Cannot view a 0-d array of {x.dtype} as {dtype}: the item sizes "
            f"differ ({old} vs {new} bytes). Reshape it to 1-d first."
        )
    last = x.shape[-1]
    if last is not None and (last * old) % new:
        raise ValueError(
            f"Cannot view an array of shape {x.shape} and dtype {x.dtype} as "
            f"{dtype}: the last axis ({last} x {old} bytes) is not a multiple "
            f"of {new} bytes. Pad or slice the last axis first."
        )
    last = None if last is None else last * old // new
    return ShapedArray(x.shape[:-1] + (last,), dtype)


def _bitcast_rule(x, *, dtype, view=False):
    dtype = np.dtype(dtype)
    if view:
        return _view_rule(x, dtype)
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


def _bitcast(x, *, dtype, view=False):
    """Reinterpret the bits of x. view=False: lax.bitcast_convert_type (a
    size change adds or drops a last axis); view=True: ndarray.view."""
    dtype = np.dtype(dtype)
    # Not np.ascontiguousarray: it turns a 0-d array into a 1-d one.
    x = np.asarray(x, order="C")
    if view or dtype.itemsize == x.dtype.itemsize:
        _bitcast_rule(ShapedArray(x.shape, x.dtype), dtype=dtype, view=view)
        return x.view(dtype)
    if dtype.itemsize < x.dtype.itemsize:
        return x.view(dtype).reshape(x.shape + (x.dtype.itemsize // dtype.itemsize,))
    return x.view(dtype).reshape(x.shape[:-1])


bitcast_convert_type_p = Primitive(
    "bitcast_convert_type", _bitcast_rule, _bitcast, nondiff="reinterprets bits"
)


# -- cost rules (formulas and constants: keras_ipu/device/simulator/cost_model.py)

convert_element_type_p.cost = _cost.elementwise(1)
bitcast_convert_type_p.cost = _cost.view
