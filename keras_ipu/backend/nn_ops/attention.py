"""Scaled dot-product attention (jax.nn.dot_product_attention semantics),
with grouped-query attention: query heads N share key/value heads K when
N is a multiple of K."""

import math

import numpy as np

from keras_ipu.backend.nn_ops import _lax as lax
from keras_ipu.backend.nn_ops.normalization import softmax
from keras_ipu.device.primitives.dot import dot_general_p

__all__ = ["dot_product_attention"]


def _large_negative(dtype):
    # Finite, so a fully masked row stays a uniform softmax, not NaN.
    value = 65500.0 if dtype == np.float16 else 3.38953e38
    return np.asarray(value * -0.7, dtype=dtype)


def _to_bnts(t, num_heads):
    """Bias/mask of rank 2-4 as a rank-4 array broadcastable to
    (batch, heads, query_time, key_time)."""
    while t.ndim < 4:
        if t.ndim == 3 and t.shape[1] == num_heads:
            t = lax.expand_dims(t, 2)
        else:
            t = lax.expand_dims(t, 1) if t.ndim == 3 else lax.expand_dims(t, 0)
    return t


def dot_product_attention(
    query,
    key,
    value,
    bias=None,
    mask=None,
    scale=None,
    is_causal=False,
    flash_attention=None,
    attn_logits_soft_cap=None,
):
    query, key, value = (lax.tensor(t) for t in (query, key, value))
    if query.ndim != 4 or key.ndim != 4 or value.ndim != 4:
        raise ValueError(
            "`dot_product_attention` only supports 4D inputs of shape "
            "(batch, time, heads, depth). Received: "
            f"query.shape={query.shape}, key.shape={key.shape}, "
            f"value.shape={value.shape}."
        )
    query, key, value = lax.promote(query, key, value)
    compute = lax.kdtype(query)
    b, t, n, h = query.shape
    k_heads = key.shape[2]
    if n is not None and k_heads is not None and n % k_heads:
        raise ValueError(
            f"The query has {n} heads, which is not a multiple of the "
            f"{k_heads} key/value heads. Grouped-query attention needs "
            "num_query_heads % num_kv_heads == 0."
        )
    groups = 1 if n is None or k_heads is None else n // k_heads
    head_dim = key.shape[-1]
    scale = 1.0 / math.sqrt(head_dim) if scale is None else scale

    # The scale multiplies the query (B, T, N, H), not the logits (B, N, T, S)
    # (Keras' own attention path does so): S / H times fewer elements, and
    # the same again for the gradient's multiply (the transformer of
    # fit_throughput: 2 MB against 8 MB each way, a quarter of the memory
    # traffic). Its bits: the logits' where the scale is a power of two (the
    # usual 1/sqrt(H) of H = 4, 16, 64, ...), within a rounding otherwise.
    query = lax.mul(query, float(scale))
    # Query heads n = k * G + g share key/value head k.
    q = lax.reshape(query, (b, t, k_heads, groups, h))
    # Contract H; batch over (B, K): (B, K, T, G, S) -> (B, K, G, T, S).
    logits = dot_general_p.bind(
        q, key, dimension_numbers=(((4,), (3,)), ((0, 2), (0, 2)))
    )
    logits = lax.transpose(logits, (0, 1, 3, 2, 4))
    # Logits, bias and masking in the compute dtype; only the softmax is
    # widened (jax.nn.dot_product_attention's reference).
    s = key.shape[1]
    logits = lax.reshape(logits, (b, n, t, s))
    if bias is not None:
        bias = _to_bnts(lax.tensor(bias, compute), n)
        logits = lax.add(logits, bias)
    if attn_logits_soft_cap is not None:
        cap = float(attn_logits_soft_cap)
        logits = lax.div(logits, lax.add(lax.div(lax.absolute(logits), cap), 1))
    keep = None
    if mask is not None:
        keep = _to_bnts(lax.cast(lax.tensor(mask), "bool"), n)
    if is_causal:
        if t is None or s is None:
            raise ValueError(
                "is_causal=True needs static query and key lengths; got "
                f"query.shape={query.shape}, key.shape={key.shape}."
            )
        causal = np.tril(np.ones((t, s), dtype=bool))[None, None]
        keep = causal if keep is None else lax.logical_and(keep, causal)
    if keep is not None:
        logits = lax.select(keep, logits, _large_negative(logits.dtype))
    # The softmax runs in at least float32.
    wide = compute if compute in ("float32", "float64") else "float32"
    probs = softmax(lax.cast(logits, wide), axis=-1)
    probs = lax.cast(probs, compute)
    probs = lax.reshape(probs, (b, k_heads, groups, t, s))
    # Contract S; batch over (B, K): (B, K, G, T, Hv).
    encoded = dot_general_p.bind(
        probs, value, dimension_numbers=(((4,), (1,)), ((0, 1), (0, 2)))
    )
    encoded = lax.transpose(encoded, (0, 3, 1, 2, 4))
    return lax.reshape(encoded, (b, t, n, value.shape[-1]))
