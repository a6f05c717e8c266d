"""Softmax family and statistics: softmax, log_softmax, sparsemax,
moments, batch_normalization."""

import numpy as np

from keras_ipu.backend.nn_ops import _lax as lax
from keras_ipu.device.primitives.control_flow import stop_gradient_p

__all__ = [
    "softmax", "log_softmax", "sparsemax", "moments", "batch_normalization",
]


def _axes(axis):
    return tuple(axis) if isinstance(axis, (list, tuple)) else axis


def _shift(x, axis):
    """The max subtracted for stability, outside autodiff (as JAX's
    softmax): the results do not depend on it, so its gradient is zero in
    exact arithmetic, and differentiating it only added a full-size
    compare/select/divide chain to every softmax's backward pass."""
    return stop_gradient_p.bind(lax.reduce_max(x, axis, keepdims=True))


def softmax(x, axis=-1):
    x = lax.float_tensor(x)
    axis = _axes(axis)
    shifted = lax.sub(x, _shift(x, axis))
    e = lax.exp(shifted)
    return lax.div(e, lax.reduce_sum(e, axis, keepdims=True))


def log_softmax(x, axis=-1):
    x = lax.float_tensor(x)
    axis = _axes(axis)
    shifted = lax.sub(x, _shift(x, axis))
    return lax.sub(
        shifted, lax.log(lax.reduce_sum(lax.exp(shifted), axis, keepdims=True))
    )


def sparsemax(x, axis=-1):
    # Projection onto the simplex (Martins & Astudillo, 2016): with z sorted
    # in decreasing order, the support is the k with 1 + k z_k > cumsum_k.
    from keras_ipu.backend import numpy as knp

    x = lax.float_tensor(x)
    axis = axis % x.ndim
    z = lax.neg(knp.sort(lax.neg(x), axis=axis))
    cumsum = knp.cumsum(z, axis=axis)
    n = x.shape[axis]
    if n is None:
        raise ValueError(
            "sparsemax needs the size of `axis` to be known; got shape "
            f"{x.shape} with axis={axis}."
        )
    rank_shape = [1] * x.ndim
    rank_shape[axis] = n
    k = np.arange(1, n + 1, dtype=x.dtype).reshape(rank_shape)
    support = lax.gt(lax.add(lax.mul(z, k), 1), cumsum)
    k_star = lax.reduce_sum(lax.cast(support, x.dtype), axis, keepdims=True)
    support_sum = lax.reduce_sum(lax.select(support, z, 0), axis, keepdims=True)
    tau = lax.div(lax.sub(support_sum, 1), k_star)
    return lax.maximum(lax.sub(x, tau), 0)


def _replica_group(axes, ndim, synchronized):
    """Replicas whose batches share the statistics (None: this replica's
    own): all of them for `synchronized=True` (Keras' BatchNormalization
    argument), groups of IPUConfig's
    norms.experimental.distributed_batch_norm_replica_group_size for any
    statistics over the batch axis (Graphcore's distributed batch norm);
    only inside a replicated program."""
    from keras_ipu.distribute.replication import replicas_in_trace

    replicas = replicas_in_trace()
    if replicas == 1:
        return None
    if synchronized:
        return replicas
    reduced = {a % ndim for a in (axes if isinstance(axes, tuple) else (axes,))}
    if 0 not in reduced:
        return None  # not a batch statistic (LayerNormalization's)
    from keras_ipu.device.config import system_config

    group = system_config.current_system().config.norms.experimental.distributed_batch_norm_replica_group_size
    return min(group, replicas) if group > 1 else None


def moments(x, axes, keepdims=False, synchronized=False):
    x = lax.float_tensor(x)
    axes = _axes(axes)
    group = _replica_group(axes, len(x.shape), synchronized)
    dtype = x.dtype
    # float16 statistics overflow easily: compute in float32, then clip to
    # the float16 range before casting back (as the other backends do).
    low = lax.kdtype(x) in ("float16", "bfloat16")
    if low:
        x = lax.cast(x, "float32")
    # Two passes (mean, then mean squared deviation): no cancellation.
    mean = lax.mean(x, axes, keepdims=True)
    if group is not None:  # the replicas' batches together (equal sizes)
        from keras_ipu.distribute.cross_replica import cross_replica_mean

        mean = cross_replica_mean(mean, replica_group_size=group)
    variance = lax.mean(lax.square(lax.sub(x, mean)), axes, keepdims=keepdims)
    if group is not None:
        variance = cross_replica_mean(variance, replica_group_size=group)
    if not keepdims:
        mean = lax.reshape(mean, variance.shape)
    if low:
        info = _finfo(dtype)
        mean = lax.cast(lax.clip(mean, info.min, info.max), dtype)
        variance = lax.cast(lax.clip(variance, info.min, info.max), dtype)
    return mean, variance


def _finfo(dtype):
    import ml_dtypes

    return ml_dtypes.finfo(dtype)


def batch_normalization(
    x, mean, variance, axis, offset=None, scale=None, epsilon=1e-3
):
    operands = [x, mean, variance]
    if offset is not None:
        operands.append(offset)
    if scale is not None:
        operands.append(scale)
    operands = lax.promote(*operands)
    x, mean, variance = operands[:3]
    rest = operands[3:]
    offset = rest.pop(0) if offset is not None else None
    scale = rest.pop(0) if scale is not None else None

    axis = axis % x.ndim
    shape = [1] * x.ndim

    def along_axis(v):
        if v.ndim != 1:
            return v
        shape[axis] = v.shape[0]
        return lax.reshape(v, shape)

    inv = lax.rsqrt(lax.add(along_axis(variance), epsilon))
    if scale is not None:
        inv = lax.mul(inv, along_axis(scale))
    bias = lax.neg(lax.mul(along_axis(mean), inv))
    if offset is not None:
        bias = lax.add(bias, along_axis(offset))
    return lax.add(lax.mul(x, inv), bias)
