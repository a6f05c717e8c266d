"""Keras dtype promotion for backend ops, shared by every backend module."""

import numpy as np

from keras.src.backend import config
from keras.src.backend.common import dtypes
from keras.src.backend.common import standardize_dtype

from keras_ipu.backend.core import _np_dtype
from keras_ipu.backend.core import convert_to_tensor

_PY_SCALARS = (int, float, bool, complex)


def dtype_of(x):
    """The Keras dtype name of x, or its Python type for weak scalars."""
    if isinstance(x, _PY_SCALARS):
        return type(x)
    dtype = getattr(x, "dtype", None)
    if dtype is None:
        return standardize_dtype(np.asarray(x).dtype)
    return standardize_dtype(dtype)


def promote(*xs, dtype=None):
    """Convert xs to tensors of their Keras result type (or `dtype`)."""
    if dtype is None:
        dtype = dtypes.result_type(*(dtype_of(x) for x in xs))
    return [convert_to_tensor(x, dtype) for x in xs]


def promote_float(*xs):
    """As promote, but integer/bool results become floatx (true division,
    transcendental functions)."""
    dtype = dtypes.result_type(*(dtype_of(x) for x in xs))
    if dtype in ("bool", "int8", "int16", "uint8", "uint16") or "int" in dtype:
        dtype = dtypes.result_type(dtype, float)
    return [convert_to_tensor(x, dtype) for x in xs]


def np_dtype(dtype):
    """A Keras dtype name, NumPy dtype or type, as a NumPy dtype."""
    if isinstance(dtype, np.dtype):
        return dtype
    return _np_dtype(standardize_dtype(dtype))


def floatx():
    return config.floatx()
