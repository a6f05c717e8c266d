"""Gradient rules of the primitives of primitives/indexing.py (contract:
keras_ipu/device/autodiff/__init__.py), registered when the primitive set
is imported (primitives/__init__.py), after every primitive is declared."""

import numpy as np

from keras_ipu.device.primitives import ad_util
from keras_ipu.device.primitives import elementwise as ew
from keras_ipu.device.primitives.indexing import dynamic_slice_p
from keras_ipu.device.primitives.indexing import dynamic_update_slice_p
from keras_ipu.device.primitives.indexing import gather_p
from keras_ipu.device.primitives.indexing import scatter_p
from keras_ipu.device.primitives.indexing import slice_p
from keras_ipu.device.primitives.structure import pad_p


def _slice_grad(cts, inputs, outputs, *, start_indices, limit_indices,
                strides):
    (g,), (x,) = cts, inputs
    config = []
    for d, s, l, st, n in zip(x.shape, start_indices, limit_indices, strides,
                              g.shape):
        if d is None or n is None:
            if s in (0, None) and l is None and st == 1:
                config.append((0, 0, 0))
                continue
            raise NotImplementedError(
                "The gradient of slice needs the sliced dimension's size; "
                f"got operand shape {x.shape}."
            )
        start, _, _ = slice(s, l, st).indices(d)
        if n == 0:
            config.append((d, 0, 0))
            continue
        covered = (n - 1) * st + 1
        config.append((start, d - start - covered, st - 1))
    # The slice's transpose: its cotangent padded back into place.
    return [pad_p.bind(g, ad_util.scalar(0, g.dtype), config=tuple(config))]


def _dynamic_slice_grad(cts, inputs, outputs, *, slice_sizes):
    (g,), (x, *starts) = cts, inputs
    x_ct = dynamic_update_slice_p.bind(ad_util.zeros_like(x), g, *starts)
    return [x_ct] + [None] * len(starts)


def _dynamic_update_slice_grad(cts, inputs, outputs):
    (g,), (x, update, *starts) = cts, inputs
    x_ct = dynamic_update_slice_p.bind(g, ad_util.zeros_like(update), *starts)
    update_ct = dynamic_slice_p.bind(
        g, *starts, slice_sizes=tuple(update.shape))
    return [x_ct, update_ct] + [None] * len(starts)


def _clipped_indices(x, indices, batch_dims):
    """The rows gather(mode="clip") actually reads: negative indices
    wrapped, then clamped into range."""
    k = indices.shape[-1]
    dims = x.shape[batch_dims:batch_dims + k]
    if any(d is None for d in dims):
        raise NotImplementedError(
            "The gradient of gather(mode='clip') needs the sizes of the "
            f"indexed axes; got operand shape {x.shape}."
        )
    dims = np.asarray(dims, dtype=indices.dtype)
    zero = np.zeros((), indices.dtype)
    wrapped = ew.select_p.bind(
        ew.lt_p.bind(indices, zero), ew.add_p.bind(indices, dims), indices)
    return ew.clamp_p.bind(
        np.zeros(dims.shape, indices.dtype), wrapped, dims - 1)


def _gather_grad(cts, inputs, outputs, *, mode, fill_value=None,
                 batch_dims=0):
    (g,), (x, indices) = cts, inputs
    if mode == "clip":
        indices = _clipped_indices(x, indices, batch_dims)
    # mode="fill": rows out of range read no operand cell; scatter drops
    # them too.
    x_ct = scatter_p.bind(ad_util.zeros_like(x), indices, g, mode="add",
                          batch_dims=batch_dims)
    return [x_ct, None]


def _scatter_grad(cts, inputs, outputs, *, mode, batch_dims=0):
    (g,), (x, indices, updates), (out,) = cts, inputs, outputs

    def read(values):
        # Dropped (out-of-range) updates get no cotangent.
        return gather_p.bind(values, indices, mode="fill",
                             fill_value=0, batch_dims=batch_dims)

    if mode == "add":
        return [g, None, read(g)]
    if mode == "update":
        # Overwritten cells pass nothing back to x. (With duplicate
        # indices every duplicate gets the cotangent of the written cell.)
        x_ct = scatter_p.bind(g, indices, ad_util.zeros_like(updates),
                              mode="update", batch_dims=batch_dims)
        return [x_ct, None, read(g)]
    if mode == "mul":
        x_ct = scatter_p.bind(g, indices, updates, mode="mul",
                              batch_dims=batch_dims)
        # d out / d update = out / update (exact for non-zero updates).
        u_ct = ew.div_p.bind(read(ew.mul_p.bind(g, out)), updates)
        return [x_ct, None, u_ct]
    # min/max: the result came from x or from updates equal to it; the
    # cotangent is shared equally among all of them (ties split it).
    def convert(v):
        return ad_util.convert(v, g.dtype)

    nan_read = gather_p.bind(out, indices, mode="fill", fill_value=np.nan,
                             batch_dims=batch_dims)
    hit_x = convert(ew.eq_p.bind(x, out))
    hit_u = convert(ew.eq_p.bind(updates, nan_read))
    count = ew.add_p.bind(hit_x, scatter_p.bind(
        ad_util.zeros_like(x), indices, hit_u, mode="add",
        batch_dims=batch_dims))
    share = ew.div_p.bind(g, count)
    return [ew.mul_p.bind(share, hit_x), None,
            ew.mul_p.bind(read(share), hit_u)]


slice_p.grad = _slice_grad
dynamic_slice_p.grad = _dynamic_slice_grad
dynamic_update_slice_p.grad = _dynamic_update_slice_grad
gather_p.grad = _gather_grad
scatter_p.grad = _scatter_grad
