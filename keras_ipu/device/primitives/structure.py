"""Primitives that move data without computing: reshape, transpose,
broadcast.

Gradient rules: grads/structure.py (registered once every primitive exists).
"""

import numpy as np

from keras_ipu.device.ir import ShapedArray
from keras_ipu.device.primitives import cost_util as _cost
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


def _sum_dims(dims):
    if any(d is None for d in dims):
        return None
    return sum(dims)


def _concatenate_rule(*xs, axis):
    if not xs:
        raise shape_rules.ShapeError("concatenate: needs at least one operand")
    dtype = shape_rules.same_dtype(*xs)
    ndim = xs[0].ndim
    if ndim == 0 or any(x.ndim != ndim for x in xs):
        raise shape_rules.ShapeError(
            "concatenate: operands must have the same rank >= 1, got shapes "
            + ", ".join(str(x.shape) for x in xs)
        )
    axis = shape_rules.normalize_axis(axis, ndim)
    shape = []
    for i in range(ndim):
        dims = [x.shape[i] for x in xs]
        if i == axis:
            shape.append(_sum_dims(dims))
            continue
        known = {d for d in dims if d is not None}
        if len(known) > 1:
            raise shape_rules.ShapeError(
                f"concatenate along axis {axis}: the other dimensions must "
                "match, got shapes " + ", ".join(str(x.shape) for x in xs)
            )
        shape.append(known.pop() if known else None)
    return ShapedArray(tuple(shape), dtype)


def _concatenate(*xs, axis):
    return np.concatenate(xs, axis=axis)


concatenate_p = Primitive("concatenate", _concatenate_rule, _concatenate)


def _padded_dim(d, lo, hi, interior):
    if d is None:
        return None
    out = lo + hi + d + max(d - 1, 0) * interior
    if out < 0:
        raise shape_rules.ShapeError(
            f"pad: ({lo}, {hi}, {interior}) on a dimension of size {d} gives "
            f"a negative size {out}"
        )
    return out


def _pad_rule(x, padding_value, *, config):
    if padding_value.ndim != 0 or padding_value.dtype != x.dtype:
        raise TypeError(
            f"pad: the padding value {padding_value.short()} must be a scalar "
            f"of the operand dtype {x.dtype.name}"
        )
    if len(config) != x.ndim:
        raise shape_rules.ShapeError(
            f"pad: config {config} needs one (lo, hi, interior) per dimension "
            f"of {x.shape}"
        )
    for lo, hi, interior in config:
        if interior < 0:
            raise shape_rules.ShapeError(f"pad: interior padding {interior} < 0")
    shape = tuple(_padded_dim(d, *c) for d, c in zip(x.shape, config))
    return ShapedArray(shape, x.dtype)


def _pad(x, padding_value, *, config):
    # Grow by the non-negative parts, then crop the negative ones.
    grown = tuple(
        _padded_dim(d, max(lo, 0), max(hi, 0), it)
        for d, (lo, hi, it) in zip(x.shape, config)
    )
    out = np.full(grown, padding_value, dtype=x.dtype)
    inner = tuple(
        slice(max(lo, 0), max(lo, 0) + max(d + (d - 1) * it, 0), it + 1)
        for d, (lo, hi, it) in zip(x.shape, config)
    )
    out[inner] = x
    crop = tuple(
        slice(max(-lo, 0), g - max(-hi, 0))
        for g, (lo, hi, _) in zip(grown, config)
    )
    return out[crop]


# pad(x, padding_value; config=((lo, hi, interior), ...)): lo/hi may be
# negative (crops), interior inserts values between elements (lax.pad).
pad_p = Primitive("pad", _pad_rule, _pad)


def _rev_rule(x, *, axes):
    for a in axes:
        shape_rules.normalize_axis(a, x.ndim)
    return ShapedArray(x.shape, x.dtype)


def _rev(x, *, axes):
    return np.flip(x, axes) if axes else x


rev_p = Primitive("rev", _rev_rule, _rev)


def _iota_rule(*, dtype, shape, dimension):
    shape_rules.normalize_axis(dimension, len(shape))
    return ShapedArray(shape, dtype)


def _iota(*, dtype, shape, dimension):
    n = shape[dimension]
    ramp = np.arange(n, dtype=dtype).reshape(
        tuple(n if i == dimension else 1 for i in range(len(shape)))
    )
    return np.broadcast_to(ramp, shape)


# iota(; dtype, shape, dimension): 0, 1, 2, ... along `dimension`.
iota_p = Primitive("iota", _iota_rule, _iota, nondiff="no operands")


# -- cost rules (formulas and constants: keras_ipu/device/simulator/cost_model.py)

# A reshape is a re-labelling of the same bytes in Poplar; the others write a
# rearranged copy.
reshape_p.cost = _cost.view
transpose_p.cost = _cost.copy
broadcast_to_p.cost = _cost.copy
concatenate_p.cost = _cost.copy
pad_p.cost = _cost.copy
rev_p.cost = _cost.copy
iota_p.cost = _cost.elementwise(1)
