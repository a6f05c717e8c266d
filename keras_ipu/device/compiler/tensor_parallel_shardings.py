"""What a value's sharding is in a tensor-parallel program (tensor_parallel.py).

A sharding is None (replicated: every IPU of the mesh axis holds all of
the value), an int d (split: IPU i holds block i of dimension d) or
PARTIAL (every IPU holds a partial sum of the whole shape; the value is
their sum).
"""

from keras_ipu.device.ir import ShapedArray

PARTIAL = "partial"


def is_split(sharding):
    """Whether `sharding` splits a dimension (an int, not PARTIAL or None)."""
    return isinstance(sharding, int) and not isinstance(sharding, bool)


def divides(aval, dim, k):
    """Whether dimension `dim` of `aval` exists and splits into k equal blocks."""
    size = aval.shape[dim] if 0 <= dim < aval.ndim else None
    return size is not None and size % k == 0


def local_aval(aval, sharding, k):
    """The block of `aval` one of `k` IPUs holds under `sharding`."""
    if not is_split(sharding):
        return aval
    shape = list(aval.shape)
    shape[sharding] //= k
    return ShapedArray(shape, aval.dtype)


def whole(shardings):
    """Shardings a sub-graph's inputs take: splits kept, partial sums summed."""
    return [s if is_split(s) else None for s in shardings]
