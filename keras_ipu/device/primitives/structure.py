"""Primitives that move data without computing: reshape, transpose,
broadcast."""

import numpy as np

from keras_ipu.device.ir import ShapedArray
from keras_ipu.device.primitives import shape_rules
from keras_ipu.device.primitives.registry import Primitive


def _reshape_rule(x, *, new_shape):
    new_shape = tuple(new_shape)
    if new_shape.count(-1) > 1:
        raise shape_rules.ShapeError(f"reshape: more than one -1 in {new_shape}")
    known_in = shape_rules.mul_dims(x.shape)
    if -1 in new_shape:
        rest = shape_rules.mul_dims(d for d in new_shape if d != -1)
        if known_in is None or rest is None:
            fill = None
        else:
            if rest == 0 or known_in % rest:
                raise shape_rules.ShapeError(
                    f"cannot reshape array of shape {x.shape} into {new_shape}"
                )
            fill = known_in // rest
        new_shape = tuple(fill if d == -1 else d for d in new_shape)
    else:
        out = shape_rules.mul_dims(new_shape)
        if known_in is not None and out is not None and out != known_in:
            raise shape_rules.ShapeError(
                f"cannot reshape array of shape {x.shape} into {new_shape}"
            )
    return ShapedArray(new_shape, x.dtype)


def _reshape(x, *, new_shape):
    return np.reshape(x, new_shape)


reshape_p = Primitive("reshape", _reshape_rule, _reshape)


def _transpose_rule(x, *, permutation):
    if sorted(permutation) != list(range(x.ndim)):
        raise shape_rules.ShapeError(
            f"transpose: {permutation} is not a permutation of rank {x.ndim}"
        )
    return ShapedArray(tuple(x.shape[p] for p in permutation), x.dtype)


def _transpose(x, *, permutation):
    return np.transpose(x, permutation)


transpose_p = Primitive("transpose", _transpose_rule, _transpose)


def _broadcast_rule(x, *, shape):
    shape = tuple(shape)
    if len(shape) < x.ndim:
        raise shape_rules.ShapeError(
            f"cannot broadcast shape {x.shape} to the lower rank {shape}"
        )
    for d_in, d_out in zip(x.shape[::-1], shape[::-1]):
        if d_in not in (1, None) and d_out is not None and d_in != d_out:
            raise shape_rules.ShapeError(f"cannot broadcast {x.shape} to {shape}")
    return ShapedArray(shape, x.dtype)


def _broadcast(x, *, shape):
    return np.broadcast_to(x, shape)


broadcast_to_p = Primitive("broadcast_to", _broadcast_rule, _broadcast)
