"""The image ops' builders: the shared lax-like wrappers of
keras_ipu.backend.prims, plus the few steps specific to images.

They accept Tensors, Tracers (dims may be None) and static constants, and
only bind primitives: nothing here reads a tensor's values.
"""

import numpy as np

from keras.src.backend.common import standardize_dtype

from keras_ipu.backend.prims import *  # noqa: F401,F403
from keras_ipu.backend.prims import cast
from keras_ipu.backend.prims import slice_axis
from keras_ipu.backend.prims import squeeze
from keras_ipu.backend.prims import transpose
from keras_ipu.device.primitives.dot import dot_general_p
from keras_ipu.device.primitives.indexing import gather_p


def check_images_rank(images):
    if len(images.shape) not in (3, 4):
        raise ValueError(
            "Invalid images rank: expected rank 3 (single image) "
            "or rank 4 (batch of images). Received input with shape: "
            f"images.shape={images.shape}"
        )


def split_channels(x, axis):
    """The planes of x along axis, each with that axis removed."""
    n = x.shape[axis]
    return [squeeze(slice_axis(x, axis, i, i + 1), axis) for i in range(n)]


def contract_axis(x, matrix, axis):
    """Apply matrix (in, out) along axis of x: the axis keeps its place and
    takes the length `out`."""
    ndim = len(x.shape)
    axis = axis % ndim
    out = dot_general_p.bind(
        x, cast(matrix, x.dtype), dimension_numbers=(((axis,), (0,)), ((), ()))
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


def float_compute_dtype(dtype, at_least="float32"):
    """Keras' result_type(dtype, at_least)."""
    from keras.src.backend.common import dtypes

    return dtypes.result_type(standardize_dtype(dtype), at_least)
