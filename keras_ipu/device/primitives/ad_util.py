"""Helpers shared by the gradient rules (as jax's ad_util) and the autodiff:
zeros, arithmetic on cotangents, summing a broadcast cotangent back to its
operand's shape, which dtypes carry cotangents. Everything binds
primitives, so a backward pass built from these helpers can be traced as
well as run eagerly. It builds on the declared primitives; the rules
(primitives/grads/) build on it.
"""

import numpy as np

from keras_ipu.device.primitives import convert as cv
from keras_ipu.device.primitives import dot
from keras_ipu.device.primitives import elementwise as ew
from keras_ipu.device.primitives import indexing
from keras_ipu.device.primitives import reduce
from keras_ipu.device.primitives import structure


def is_differentiable(dtype):
    """Floating and complex values carry cotangents; integers and bools do
    not (their gradient is None: zero)."""
    dtype = np.dtype(dtype)
    return dtype.kind in "fc" or dtype.name == "bfloat16"


def scalar(value, dtype):
    """A 0-d constant of `dtype` (a Literal when traced)."""
    return np.asarray(value, dtype=np.dtype(dtype))


def const(value, like):
    """A 0-d constant of `like`'s dtype."""
    return scalar(value, like.dtype)


def add(a, b):
    return ew.add_p.bind(a, b)


def sub(a, b):
    return ew.sub_p.bind(a, b)


def mul(a, b):
    return ew.mul_p.bind(a, b)


def div(a, b):
    return ew.div_p.bind(a, b)


def neg(a):
    return ew.neg_p.bind(a)


def square(a):
    return ew.mul_p.bind(a, a)


def zeros_like(x):
    """Zeros of x's shape and dtype. With unknown (None) dims the shape is
    taken from x itself (select over a predicate of x's shape)."""
    zero = scalar(0, x.dtype)
    if all(d is not None for d in x.shape):
        return structure.broadcast_to_p.bind(zero, shape=tuple(x.shape))
    return ew.select_p.bind(ew.isnan_p.bind(x), zero, zero)


def _known_shape(shape):
    """A reshape target: one unknown dim becomes -1 (more stay None: such a
    graph only describes shapes, it never runs)."""
    shape = tuple(shape)
    if shape.count(None) == 1:
        return tuple(-1 if d is None else d for d in shape)
    return shape


def reshape(x, shape):
    if tuple(x.shape) == tuple(shape) and None not in tuple(shape):
        return x
    return structure.reshape_p.bind(x, new_shape=_known_shape(shape))


def unbroadcast(ct, shape):
    """Sum the cotangent `ct` of a broadcast result back to `shape` (the
    operand's shape): over the leading axes the operand lacks and over the
    axes where the operand has size 1."""
    if ct is None:
        return None
    shape = tuple(shape)
    ct_shape = tuple(ct.shape)
    if ct_shape == shape:
        return ct
    lead = len(ct_shape) - len(shape)
    axes = list(range(lead))
    for i, d in enumerate(shape):
        if d == 1 and ct_shape[lead + i] != 1:
            axes.append(lead + i)
    if axes:
        ct = reduce.reduce_sum_p.bind(ct, axes=tuple(axes))
    return reshape(ct, shape)


def convert(x, dtype):
    dtype = np.dtype(dtype)
    if x is None or x.dtype == dtype:
        return x
    return cv.convert_element_type_p.bind(x, dtype=dtype)


def add_any(a, b):
    """a + b where None is zero."""
    if a is None:
        return b
    if b is None:
        return a
    return ew.add_p.bind(a, b)


def broadcast_back(g, x, axes):
    """g, the result of reducing x over `axes`, reshaped with those axes
    kept as size 1 and broadcast to x's shape."""
    x_shape = tuple(x.shape)
    kept = tuple(1 if i in axes else d for i, d in enumerate(x_shape))
    g = reshape(g, kept)
    if None in x_shape:
        # The shape is only known from x (traced): broadcast against it.
        pred = ew.isnan_p.bind(x)
        return ew.select_p.bind(pred, g, g)
    return structure.broadcast_to_p.bind(g, shape=x_shape)


def matrix_transpose(x):
    perm = tuple(range(x.ndim - 2)) + (x.ndim - 1, x.ndim - 2)
    return structure.transpose_p.bind(x, permutation=perm)


def matmul(a, b):
    """Batched a @ b over the last two axes (same batch shape)."""
    nb = a.ndim - 2
    batch = tuple(range(nb))
    return dot.dot_general_p.bind(
        a, b, dimension_numbers=(((a.ndim - 1,), (nb,)), (batch, batch))
    )


def scatter_add_last_axis(x, indices, g):
    """Zeros shaped like x with g (shape batch + (k,)) added at `indices`
    (same shape) along x's last axis: the transpose of a gather of the last
    axis (take_along_axis)."""
    idx = structure.reshape_p.bind(
        indices, new_shape=_known_shape(tuple(indices.shape) + (1,)))
    return indexing.scatter_p.bind(
        zeros_like(x), idx, g, mode="add", batch_dims=x.ndim - 1
    )
