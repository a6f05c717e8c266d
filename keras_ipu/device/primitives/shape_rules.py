"""Shared shape/dtype rules. Dimensions may be None (unknown)."""

import numpy as np

from keras_ipu.device.ir import ShapedArray


class ShapeError(ValueError):
    pass


def broadcast_shapes(*shapes):
    ndim = max((len(s) for s in shapes), default=0)
    out = []
    for axis in range(ndim):
        dims = [
            s[axis - ndim + len(s)] for s in shapes if axis - ndim + len(s) >= 0
        ]
        known = {d for d in dims if d is not None and d != 1}
        if len(known) > 1:
            raise ShapeError(
                "Shapes cannot be broadcast together: "
                + ", ".join(str(tuple(s)) for s in shapes)
            )
        if known:
            out.append(known.pop())
        elif any(d is None for d in dims):
            out.append(None)
        else:
            out.append(1)
    return tuple(out)


def same_dtype(*avals):
    dtypes = {a.dtype for a in avals}
    if len(dtypes) > 1:
        raise TypeError(
            "Primitive operands must share one dtype (the backend promotes "
            f"first); got {sorted(d.name for d in dtypes)}."
        )
    return avals[0].dtype


def elementwise(dtype=None):
    """Rule for n-ary elementwise ops with broadcasting.

    dtype: None keeps the (common) operand dtype; a dtype or a function of
    the operand dtype gives the result dtype.
    """

    def rule(*avals, **params):
        in_dtype = same_dtype(*avals)
        shape = broadcast_shapes(*(a.shape for a in avals))
        if dtype is None:
            out = in_dtype
        elif callable(dtype):
            out = dtype(in_dtype)
        else:
            out = np.dtype(dtype)
        return ShapedArray(shape, out)

    return rule


def normalize_axis(axis, ndim):
    if axis < -ndim or axis >= max(ndim, 1):
        raise ShapeError(f"axis {axis} is out of bounds for rank {ndim}")
    return axis % ndim if ndim else 0


def normalize_axes(axes, ndim):
    if axes is None:
        return tuple(range(ndim))
    if isinstance(axes, int):
        axes = (axes,)
    out = tuple(sorted({normalize_axis(a, ndim) for a in axes}))
    return out


def mul_dims(dims):
    """Product of dims, None if any is unknown."""
    out = 1
    for d in dims:
        if d is None:
            return None
        out *= d
    return out
