"""Encodings and losses: one_hot, multi_hot, cross-entropies, psnr."""

import math

import numpy as np

from keras.src import backend as keras_backend

from keras_ipu.backend.nn_ops import _lax as lax
from keras_ipu.backend.nn_ops.activations import sigmoid
from keras_ipu.backend.nn_ops.normalization import log_softmax
from keras_ipu.device.primitives.reduce import reduce_or_p

__all__ = [
    "one_hot", "multi_hot", "categorical_crossentropy",
    "sparse_categorical_crossentropy", "binary_crossentropy", "psnr",
]


def _no_sparse(sparse, name):
    if sparse:
        raise ValueError(
            f"`{name}(sparse=True)` is not supported by the ipu backend: IPU "
            "programs use dense tensors. Use sparse=False."
        )


def _one_hot_mask(x, num_classes, axis):
    """Bool one-hot of integer x; negative or too-large indices give an
    all-false row."""
    classes = np.arange(num_classes, dtype=x.dtype)
    hot = lax.eq(lax.expand_dims(x, -1), classes)
    if axis not in (-1, hot.ndim - 1):
        hot = lax.moveaxis(hot, -1, axis)
    return hot


def one_hot(x, num_classes, axis=-1, dtype=None, sparse=False):
    _no_sparse(sparse, "one_hot")
    x = lax.tensor(x)
    if not lax.kdtype(x).startswith(("int", "uint")):
        x = lax.cast(x, "int32")
    dtype = dtype or "float32"
    return lax.cast(_one_hot_mask(x, int(num_classes), axis), dtype)


def multi_hot(x, num_classes, axis=-1, dtype=None, sparse=False):
    _no_sparse(sparse, "multi_hot")
    x = lax.tensor(x)
    if not lax.kdtype(x).startswith(("int", "uint")):
        x = lax.cast(x, "int32")
    hot = _one_hot_mask(x, int(num_classes), axis)
    # Batched input (rank > 1) collapses its index axis 1; 1D input axis 0.
    reduce_axis = 1 if x.ndim > 1 else 0
    hit = lax.reduce(reduce_or_p, hot, reduce_axis)
    return lax.cast(hit, dtype or "float32")


def _check_same_shape(target, output):
    if tuple(target.shape) != tuple(output.shape):
        raise ValueError(
            "Arguments `target` and `output` must have the same shape. "
            f"Received: target.shape={target.shape}, "
            f"output.shape={output.shape}"
        )


def _clipped_log_probs(output, axis):
    eps = keras_backend.epsilon()
    output = lax.div(output, lax.reduce_sum(output, axis, keepdims=True))
    return lax.log(lax.clip(output, eps, 1.0 - eps))


def _log_probs(output, from_logits, axis):
    """log p of logits (log_softmax) or of probabilities (clipped, as Keras)."""
    if from_logits:
        return log_softmax(output, axis=axis)
    return _clipped_log_probs(output, axis)


def categorical_crossentropy(target, output, from_logits=False, axis=-1):
    target, output = lax.promote(target, output, floating=True)
    _check_same_shape(target, output)
    if target.ndim < 1:
        raise ValueError(
            "Arguments `target` and `output` must be at least rank 1. "
            f"Received: target.shape={target.shape}, "
            f"output.shape={output.shape}"
        )
    log_prob = _log_probs(output, from_logits, axis)
    return lax.neg(lax.reduce_sum(lax.mul(target, log_prob), axis))


def sparse_categorical_crossentropy(target, output, from_logits=False, axis=-1):
    target = lax.cast(lax.tensor(target), "int32")
    output = lax.float_tensor(output)
    if target.ndim == output.ndim and target.shape[-1] == 1:
        target = lax.reshape(target, target.shape[:-1])
    if output.ndim < 1:
        raise ValueError(
            "Argument `output` must be at least rank 1. "
            f"Received: output.shape={output.shape}"
        )
    expected = tuple(output.shape[:-1])
    if len(target.shape) != len(expected) or any(
        a is not None and b is not None and a != b
        for a, b in zip(target.shape, expected)
    ):
        raise ValueError(
            "Arguments `target` and `output` must have the same shape up "
            f"until the last dimension: target.shape={target.shape}, "
            f"output.shape={output.shape}"
        )
    log_prob = _log_probs(output, from_logits, axis)
    hot = _one_hot_mask(target, output.shape[axis], axis)
    return lax.neg(lax.reduce_sum(lax.select(hot, log_prob, 0), axis))


def binary_crossentropy(target, output, from_logits=False):
    target, output = lax.promote(target, output, floating=True)
    _check_same_shape(target, output)
    if from_logits:
        output = sigmoid(output)
    eps = keras_backend.epsilon()
    output = lax.clip(output, eps, 1.0 - eps)
    positive = lax.mul(target, lax.log(output))
    negative = lax.mul(lax.sub(1, target), lax.log(lax.sub(1, output)))
    return lax.neg(lax.add(positive, negative))


def psnr(x1, x2, max_val):
    x1, x2 = lax.promote(x1, x2, floating=True)
    if tuple(x1.shape) != tuple(x2.shape):
        raise ValueError(
            f"Input shapes {x1.shape} and {x2.shape} must match for PSNR "
            "calculation."
        )
    max_val = lax.tensor(max_val, lax.kdtype(x2))
    mse = lax.mean(lax.square(lax.sub(x1, x2)))
    to_db = 10 / math.log(10)
    return lax.sub(
        lax.mul(lax.log(max_val), 2 * to_db), lax.mul(lax.log(mse), to_db)
    )
