"""Products of keras.ops.numpy: matmul, dot, tensordot, einsum, inner,
outer, vdot, cross. Every contraction is one `dot_general`."""

import numpy as np

from keras.src.backend.common import dtypes

from keras_ipu.backend import prims as b
from keras_ipu.device.primitives import shape_rules
from keras_ipu.device.primitives.dot import dot_general_p

__all__ = [
    "matmul",
    "dot",
    "tensordot",
    "einsum",
    "inner",
    "outer",
    "vdot",
    "cross",
]


def _promote(*xs):
    xs = [b.tensor(x) for x in xs]
    dtype = dtypes.result_type(*(b.kdtype(x) for x in xs))
    return [b.cast(x, dtype) for x in xs], dtype


def _preferred(dtype_names):
    """int8 products accumulate in int32 (Keras' rule for matmul/einsum,
    which the IPU's int8 dot units follow too)."""
    if dtype_names and all(d == "int8" for d in dtype_names):
        return np.dtype(np.int32)
    return None


def _dot_general(lhs, rhs, contract, batch=((), ()), preferred=None):
    return dot_general_p.bind(
        lhs,
        rhs,
        dimension_numbers=(
            (tuple(contract[0]), tuple(contract[1])),
            (tuple(batch[0]), tuple(batch[1])),
        ),
        preferred_element_type=preferred,
    )


def _check_contract(x1, x2, a1, a2, name):
    d1, d2 = x1.shape[a1], x2.shape[a2]
    if d1 is not None and d2 is not None and d1 != d2:
        raise ValueError(
            f"{name}: the contracted dimensions differ: x1 shape {x1.shape} "
            f"(axis {a1} = {d1}) and x2 shape {x2.shape} (axis {a2} = {d2}). "
            "They must have the same size."
        )


def matmul(x1, x2):
    names = [b.kdtype(b.tensor(x)) for x in (x1, x2)]
    (x1, x2), _ = _promote(x1, x2)
    preferred = _preferred(names)
    if x1.ndim == 0 or x2.ndim == 0:
        raise ValueError(
            "matmul: inputs must be at least 1-D (use multiply for scalars); "
            f"got shapes {x1.shape} and {x2.shape}"
        )
    squeeze_first = x1.ndim == 1
    squeeze_last = x2.ndim == 1
    if squeeze_first:
        x1 = b.reshape(x1, (1,) + tuple(x1.shape))
    if squeeze_last:
        x2 = b.reshape(x2, tuple(x2.shape) + (1,))
    _check_contract(x1, x2, x1.ndim - 1, x2.ndim - 2, "matmul")
    if x2.ndim == 2:
        # (..., m, k) @ (k, n): one contraction, no broadcast copies.
        out = _dot_general(x1, x2, ((x1.ndim - 1,), (0,)), preferred=preferred)
    elif x1.ndim == 2:
        # (m, k) @ (..., k, n) -> (m, ..., n) -> (..., m, n)
        out = _dot_general(x1, x2, ((1,), (x2.ndim - 2,)), preferred=preferred)
        out = b.moveaxis(out, 0, out.ndim - 2)
    else:
        batch = shape_rules.broadcast_shapes(x1.shape[:-2], x2.shape[:-2])
        x1 = b.broadcast_to(x1, batch + tuple(x1.shape[-2:]))
        x2 = b.broadcast_to(x2, batch + tuple(x2.shape[-2:]))
        nb = len(batch)
        out = _dot_general(
            x1,
            x2,
            ((nb + 1,), (nb,)),
            (tuple(range(nb)), tuple(range(nb))),
            preferred=preferred,
        )
    if squeeze_first:
        out = b.squeeze(out, (out.ndim - 2,))
    if squeeze_last:
        out = b.squeeze(out, (out.ndim - 1,))
    return out


def dot(x1, x2):
    (x1, x2), _ = _promote(x1, x2)
    if x1.ndim == 0 or x2.ndim == 0:
        return b.mul(x1, x2)
    a2 = 0 if x2.ndim == 1 else x2.ndim - 2
    _check_contract(x1, x2, x1.ndim - 1, a2, "dot")
    return _dot_general(x1, x2, ((x1.ndim - 1,), (a2,)))


def tensordot(x1, x2, axes=2):
    (x1, x2), _ = _promote(x1, x2)
    if isinstance(axes, int):
        if axes < 0 or axes > min(x1.ndim, x2.ndim):
            raise ValueError(
                f"tensordot: axes={axes} must be between 0 and the smaller "
                f"rank ({min(x1.ndim, x2.ndim)})"
            )
        a1 = tuple(range(x1.ndim - axes, x1.ndim))
        a2 = tuple(range(axes))
    else:
        if len(axes) != 2:
            raise ValueError(
                "tensordot: axes must be an int or a pair (axes of x1, axes "
                f"of x2); got axes={axes}"
            )
        a1, a2 = axes
        a1 = (a1,) if isinstance(a1, int) else tuple(a1)
        a2 = (a2,) if isinstance(a2, int) else tuple(a2)
        if len(a1) != len(a2):
            raise ValueError(
                f"tensordot: x1 and x2 need as many axes each; got axes={axes}"
            )
        a1 = tuple(b.axis_of(a, x1.ndim) for a in a1)
        a2 = tuple(b.axis_of(a, x2.ndim) for a in a2)
    for i, j in zip(a1, a2):
        _check_contract(x1, x2, i, j, "tensordot")
    return _dot_general(x1, x2, (a1, a2))


def inner(x1, x2):
    (x1, x2), _ = _promote(x1, x2)
    if x1.ndim == 0 or x2.ndim == 0:
        return b.mul(x1, x2)
    _check_contract(x1, x2, x1.ndim - 1, x2.ndim - 1, "inner")
    return _dot_general(x1, x2, ((x1.ndim - 1,), (x2.ndim - 1,)))


def outer(x1, x2):
    (x1, x2), _ = _promote(x1, x2)
    return b.mul(
        b.reshape(b.flatten(x1), (-1, 1)), b.reshape(b.flatten(x2), (1, -1))
    )


def vdot(x1, x2):
    (x1, x2), _ = _promote(x1, x2)
    return _dot_general(b.conj(b.flatten(x1)), b.flatten(x2), ((0,), (0,)))


def cross(x1, x2, axisa=-1, axisb=-1, axisc=-1, axis=None):
    (x1, x2), _ = _promote(x1, x2)
    if axis is not None:
        axisa = axisb = axisc = axis
    x1 = b.moveaxis(x1, b.axis_of(axisa, x1.ndim), x1.ndim - 1)
    x2 = b.moveaxis(x2, b.axis_of(axisb, x2.ndim), x2.ndim - 1)
    n1, n2 = x1.shape[-1], x2.shape[-1]
    if n1 not in (2, 3) or n2 not in (2, 3):
        raise ValueError(
            "cross: the vector axes must have 2 or 3 components, got "
            f"{n1} (x1 shape {x1.shape}) and {n2} (x2 shape {x2.shape})"
        )

    def parts(x, n):
        last = x.ndim - 1
        comps = [
            b.squeeze(b.slice_axis(x, last, i, i + 1), (last,)) for i in range(n)
        ]
        if n == 2:
            comps.append(None)
        return comps

    a0, a1, a2 = parts(x1, n1)
    c0, c1, c2 = parts(x2, n2)
    cz = b.sub(b.mul(a0, c1), b.mul(a1, c0))
    if n1 == 2 and n2 == 2:
        return cz

    def prod(p, q):
        return None if p is None or q is None else b.mul(p, q)

    def minus(p, q):
        if q is None:
            return p
        if p is None:
            return b.neg(q)
        return b.sub(p, q)

    # Each component mixes one part of x1 with one of x2, so all three
    # already have the broadcast shape of the operands.
    cx = minus(prod(a1, c2), prod(a2, c1))
    cy = minus(prod(a2, c0), prod(a0, c2))
    last = cz.ndim
    out = b.concatenate([b.expand_dims(c, [last]) for c in (cx, cy, cz)], last)
    return b.moveaxis(out, out.ndim - 1, b.axis_of(axisc, out.ndim))


# ----------------------------------------------------------------- einsum


def einsum(subscripts, *operands, **kwargs):
    from keras_ipu.backend.numpy import _einsum

    unknown = set(kwargs) - {"optimize", "preferred_element_type", "precision"}
    if unknown:
        raise TypeError(f"einsum got unexpected keyword arguments {sorted(unknown)}")
    names = [b.kdtype(b.tensor(x)) for x in operands]
    operands, _ = _promote(*operands)
    preferred = kwargs.get("preferred_element_type")
    preferred = b.np_dtype(preferred) if preferred else _preferred(names)
    return _einsum.einsum(subscripts, operands, preferred)

