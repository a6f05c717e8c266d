"""Gradient rules of the primitives of primitives/structure.py (contract:
keras_ipu/device/autodiff/__init__.py), registered when the primitive set
is imported (primitives/__init__.py), after every primitive is declared."""

import numpy as np

from keras_ipu.device.primitives import ad_util
from keras_ipu.device.primitives import shape_rules
from keras_ipu.device.primitives.elementwise import sub_p
from keras_ipu.device.primitives.indexing import slice_p
from keras_ipu.device.primitives.reduce import reduce_sum_p
from keras_ipu.device.primitives.structure import broadcast_to_p
from keras_ipu.device.primitives.structure import concatenate_p
from keras_ipu.device.primitives.structure import pad_p
from keras_ipu.device.primitives.structure import reshape_p
from keras_ipu.device.primitives.structure import rev_p
from keras_ipu.device.primitives.structure import transpose_p


def _reshape_grad(cts, inputs, outputs, *, new_shape):
    return [ad_util.reshape(cts[0], inputs[0].shape)]


def _transpose_grad(cts, inputs, outputs, *, permutation):
    inverse = tuple(int(i) for i in np.argsort(permutation))
    return [transpose_p.bind(cts[0], permutation=inverse)]


def _broadcast_grad(cts, inputs, outputs, *, shape):
    return [ad_util.unbroadcast(cts[0], inputs[0].shape)]


def _concatenate_grad(cts, inputs, outputs, *, axis):
    (g,) = cts
    ndim = g.ndim
    axis = shape_rules.normalize_axis(axis, ndim)
    out = []
    start = 0
    for i, x in enumerate(inputs):
        size = x.shape[axis]
        last = i == len(inputs) - 1
        if size is None and not last:
            raise NotImplementedError(
                "The gradient of concatenate needs the sizes along the "
                f"concatenated axis; operand {i} has shape {x.shape}."
            )
        limit = None if last else start + size
        out.append(slice_p.bind(
            g,
            start_indices=tuple(start if a == axis else 0 for a in range(ndim)),
            limit_indices=tuple(limit if a == axis else None
                                for a in range(ndim)),
            strides=(1,) * ndim,
        ))
        if not last:
            start += size
    return out


def _pad_grad(cts, inputs, outputs, *, config):
    (g,), (x, value) = cts, inputs
    # Undo lo/hi (crop what was added, zero-fill what was cropped), then
    # drop the interior padding with a strided slice.
    unpad = tuple((-lo, -hi, 0) for lo, hi, _ in config)
    unpadded = pad_p.bind(g, ad_util.scalar(0, g.dtype), config=unpad)
    x_ct = slice_p.bind(
        unpadded,
        start_indices=(0,) * g.ndim,
        limit_indices=(None,) * g.ndim,
        strides=tuple(interior + 1 for _, _, interior in config),
    )
    all_axes = tuple(range(g.ndim))
    # Every cell of the result that is not an operand cell is the value.
    value_ct = _sub(reduce_sum_p.bind(g, axes=all_axes),
                    reduce_sum_p.bind(x_ct, axes=all_axes))
    return [x_ct, value_ct]


def _sub(a, b):
    return sub_p.bind(a, b)


def _rev_grad(cts, inputs, outputs, *, axes):
    return [rev_p.bind(cts[0], axes=axes)]


reshape_p.grad = _reshape_grad
transpose_p.grad = _transpose_grad
broadcast_to_p.grad = _broadcast_grad
concatenate_p.grad = _concatenate_grad
pad_p.grad = _pad_grad
rev_p.grad = _rev_grad
