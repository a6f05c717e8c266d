"""Activation functions. Each keeps the (floating) dtype of its input;
integer inputs of smooth activations become floatx, as in JAX."""

import math

from keras_ipu.backend.nn_ops import _lax as lax

__all__ = [
    "relu", "relu6", "sigmoid", "sparse_sigmoid", "tanh", "tanh_shrink",
    "softplus", "softsign", "soft_shrink", "sparse_plus", "silu",
    "squareplus", "log_sigmoid", "leaky_relu", "hard_sigmoid", "hard_silu",
    "elu", "selu", "gelu", "celu", "glu", "hard_tanh", "hard_shrink",
    "threshold",
]

_SELU_ALPHA = 1.6732632423543772848170429916717
_SELU_SCALE = 1.0507009873554804934193349852946


def relu(x):
    x = lax.tensor(x)
    return lax.maximum(x, 0)


def relu6(x):
    x = lax.tensor(x)
    return lax.clip(x, 0, 6)


def sigmoid(x):
    return lax.logistic(lax.float_tensor(x))


def sparse_sigmoid(x):
    x = lax.float_tensor(x)
    inner = lax.mul(lax.add(x, 1), 0.5)
    return lax.select(lax.le(x, -1), 0, lax.select(lax.ge(x, 1), 1, inner))


def tanh(x):
    return lax.tanh(lax.float_tensor(x))


def tanh_shrink(x):
    x = lax.float_tensor(x)
    return lax.sub(x, lax.tanh(x))


def softplus(x):
    x = lax.float_tensor(x)
    return lax.logaddexp(x, 0)


def softsign(x):
    x = lax.float_tensor(x)
    return lax.div(x, lax.add(lax.absolute(x), 1))


def soft_shrink(x, threshold=0.5):
    x = lax.float_tensor(x)
    t = lax.scalar(threshold, x)
    return lax.select(
        lax.gt(x, t),
        lax.sub(x, t),
        lax.select(lax.lt(x, lax.neg(t)), lax.add(x, t), 0),
    )


def sparse_plus(x):
    x = lax.float_tensor(x)
    middle = lax.mul(lax.square(lax.add(x, 1)), 0.25)
    return lax.select(lax.le(x, -1), 0, lax.select(lax.lt(x, 1), middle, x))


def silu(x):
    x = lax.float_tensor(x)
    return lax.mul(x, lax.logistic(x))


def squareplus(x, b=4):
    x = lax.float_tensor(x)
    b = lax.tensor(b, lax.kdtype(x))
    return lax.mul(lax.add(x, lax.sqrt(lax.add(lax.square(x), b))), 0.5)


def log_sigmoid(x):
    x = lax.float_tensor(x)
    return lax.neg(lax.logaddexp(lax.neg(x), 0))


def leaky_relu(x, negative_slope=0.2):
    x = lax.float_tensor(x)
    return lax.select(lax.ge(x, 0), x, lax.mul(x, negative_slope))


def hard_sigmoid(x):
    x = lax.float_tensor(x)
    return lax.clip(lax.add(lax.div(x, 6), 0.5), 0, 1)


def hard_silu(x):
    x = lax.float_tensor(x)
    return lax.mul(x, hard_sigmoid(x))


def elu(x, alpha=1.0):
    x = lax.float_tensor(x)
    return lax.select(lax.gt(x, 0), x, lax.mul(lax.expm1(x), alpha))


def selu(x):
    return lax.mul(elu(x, _SELU_ALPHA), _SELU_SCALE)


def gelu(x, approximate=True):
    x = lax.float_tensor(x)
    if approximate:
        # 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
        inner = lax.add(x, lax.mul(lax.pow(x, 3), 0.044715))
        inner = lax.mul(inner, math.sqrt(2 / math.pi))
        return lax.mul(lax.mul(x, 0.5), lax.add(lax.tanh(inner), 1))
    cdf = lax.add(lax.erf(lax.mul(x, 1 / math.sqrt(2))), 1)
    return lax.mul(lax.mul(x, 0.5), cdf)


def celu(x, alpha=1.0):
    x = lax.float_tensor(x)
    negative = lax.mul(lax.expm1(lax.div(lax.minimum(x, 0), alpha)), alpha)
    return lax.add(lax.maximum(x, 0), negative)


def glu(x, axis=-1):
    from keras_ipu.backend import numpy as knp

    x = lax.float_tensor(x)
    size = x.shape[axis]
    if size is not None and size % 2:
        raise ValueError(
            "glu splits `x` in two halves along `axis`, so that axis must "
            f"have an even size. Received: x.shape={x.shape} with axis={axis}"
        )
    a, b = knp.split(x, 2, axis=axis)
    return lax.mul(a, lax.logistic(b))


def hard_tanh(x):
    x = lax.float_tensor(x)
    return lax.clip(x, -1, 1)


def hard_shrink(x, threshold=0.5):
    x = lax.float_tensor(x)
    return lax.select(lax.gt(lax.absolute(x), threshold), x, 0)


def threshold(x, threshold, default_value):
    x = lax.float_tensor(x)
    return lax.select(lax.gt(x, threshold), x, default_value)
