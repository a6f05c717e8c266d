"""Gradient rules of the primitives of primitives/sort.py (contract:
keras_ipu/device/autodiff/__init__.py), registered when the primitive set
is imported (primitives/__init__.py), after every primitive is declared."""

import numpy as np

from keras_ipu.device.primitives import ad_util
from keras_ipu.device.primitives import structure
from keras_ipu.device.primitives.sort import sort_p
from keras_ipu.device.primitives.sort import top_k_p


def _sort_grad(cts, inputs, outputs, *, dimension, num_keys=1,
               descending=False):
    # The sorting permutation (sorting an iota along with the keys), then
    # each cotangent is put back in place by sorting it by that permutation.
    dimension = dimension % inputs[0].ndim
    keys = inputs[:num_keys]
    iota = structure.iota_p.bind(
        dtype=np.dtype(np.int32), shape=tuple(inputs[0].shape),
        dimension=dimension)
    perm = sort_p.bind(
        *keys, iota, dimension=dimension, num_keys=num_keys,
        descending=descending)[-1]
    live = [i for i, (g, x) in enumerate(zip(cts, inputs))
            if g is not None and ad_util.is_differentiable(x.dtype)]
    if not live:
        return [None] * len(inputs)
    back = sort_p.bind(
        perm, *(cts[i] for i in live), dimension=dimension, num_keys=1)[1:]
    out = [None] * len(inputs)
    for i, b in zip(live, back):
        out[i] = b
    return out


def _top_k_grad(cts, inputs, outputs, *, k, index_dtype=np.dtype(np.int32)):
    (g, _), (x,), (_, indices) = cts, inputs, outputs
    if g is None:
        return [None]
    return [ad_util.scatter_add_last_axis(x, indices, g)]


sort_p.grad = _sort_grad
top_k_p.grad = _top_k_grad
