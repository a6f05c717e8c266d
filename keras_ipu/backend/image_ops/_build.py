"""Small builders on device primitives for the image ops.

They accept Tensors, Tracers (dims may be None) and static constants, and
only bind primitives: nothing here reads a tensor's values.
"""

import numpy as np

from keras.src.backend.common import standardize_dtype

from keras_ipu.backend.core import _np_dtype
from keras_ipu.backend.core import convert_to_tensor
from keras_ipu.device.array import Tensor
from keras_ipu.device.primitives import elementwise as ew
from keras_ipu.device.primitives.convert import convert_element_type_p
from keras_ipu.device.primitives.dot import dot_general_p
from keras_ipu.device.primitives.indexing import gather_p
from keras_ipu.device.primitives.indexing import slice_p
from keras_ipu.device.primitives.structure import concatenate_p
from keras_ipu.device.primitives.structure import reshape_p
from keras_ipu.device.primitives.structure import transpose_p
from keras_ipu.device.trace import Tracer


def is_array(x):
    return isinstance(x, (Tensor, Tracer))


def np_dtype(dtype):
    if isinstance(dtype, np.dtype):
        return dtype
    return _np_dtype(standardize_dtype(dtype))


def kdtype(x):
    return standardize_dtype(x.dtype)


def tensor(x, dtype=None):
    return convert_to_tensor(x, dtype)


def as_dtype(x, dtype):
    """x as an operand of dtype: arrays converted, constants wrapped."""
    dtype = np_dtype(dtype)
    if is_array(x):
        return x if x.dtype == dtype else convert_element_type_p.bind(x, dtype=dtype)
    return np.asarray(x, dtype=dtype)


def _common(*xs):
    for x in xs:
        if is_array(x) or isinstance(x, np.ndarray):
            return x.dtype
    raise TypeError("no array operand")


def binary(prim, a, b):
    dtype = _common(a, b)
    return prim.bind(as_dtype(a, dtype), as_dtype(b, dtype))


def add(a, b):
    return binary(ew.add_p, a, b)


def sub(a, b):
    return binary(ew.sub_p, a, b)


def mul(a, b):
    return binary(ew.mul_p, a, b)


def div(a, b):
    return binary(ew.div_p, a, b)


def maximum(a, b):
    return binary(ew.max_p, a, b)


def minimum(a, b):
    return binary(ew.min_p, a, b)


def mod(a, b):
    return binary(ew.mod_p, a, b)


def compare(prim, a, b):
    return binary(prim, a, b)


def logical_and(a, b):
    return ew.and_p.bind(a, b)


def select(pred, on_true, on_false):
    dtype = _common(on_true, on_false)
    return ew.select_p.bind(pred, as_dtype(on_true, dtype), as_dtype(on_false, dtype))


def clip(x, lo, hi):
    return minimum(maximum(x, lo), hi)


def transpose(x, perm):
    perm = tuple(int(p) for p in perm)
    if perm == tuple(range(len(perm))):
        return x
    return transpose_p.bind(x, permutation=perm)


def reshape(x, shape):
    return reshape_p.bind(x, new_shape=tuple(shape))


def expand_dims(x, axis):
    shape = list(x.shape)
    axis = axis % (len(shape) + 1)
    shape.insert(axis, 1)
    return reshape(x, shape)


def squeeze(x, axis):
    shape = list(x.shape)
    del shape[axis]
    return reshape(x, shape)


def slice_axis(x, axis, start, stop):
    ndim = len(x.shape)
    axis = axis % ndim
    starts = tuple(start if i == axis else 0 for i in range(ndim))
    stops = tuple(stop if i == axis else None for i in range(ndim))
    return slice_p.bind(
        x, start_indices=starts, limit_indices=stops, strides=(1,) * ndim
    )


def concatenate(xs, axis):
    axis = axis % len(xs[0].shape)
    return concatenate_p.bind(*xs, axis=axis)


def split_channels(x, axis):
    """The planes of x along axis, each with that axis removed."""
    n = x.shape[axis]
    return [squeeze(slice_axis(x, axis, i, i + 1), axis) for i in range(n)]


def stack(xs, axis):
    return concatenate([expand_dims(x, axis) for x in xs], axis)


def contract_axis(x, matrix, axis):
    """Apply matrix (in, out) along axis of x: the axis keeps its place and
    takes the length `out`."""
    ndim = len(x.shape)
    axis = axis % ndim
    out = dot_general_p.bind(
        x, as_dtype(matrix, x.dtype), dimension_numbers=(((axis,), (0,)), ((), ()))
    )
    perm = list(range(ndim - 1))
    perm.insert(axis, ndim - 1)
    return transpose(out, perm)


def take_axis(x, indices, axis):
    """x gathered along axis at static integer indices (1-D)."""
    ndim = len(x.shape)
    axis = axis % ndim
    front = [axis] + [i for i in range(ndim) if i != axis]
    moved = transpose(x, front)
    idx = np.asarray(indices, np.int32).reshape(-1, 1)
    gathered = gather_p.bind(moved, idx, mode="clip")
    back = list(np.argsort(front))
    return transpose(gathered, back)


def cast(x, dtype):
    return as_dtype(x, dtype)


def float_compute_dtype(dtype, at_least="float32"):
    """Keras' result_type(dtype, at_least)."""
    from keras.src.backend.common import dtypes

    return dtypes.result_type(standardize_dtype(dtype), at_least)
