"""Graph-mode rules (emitter.py's `graph` mode) of the array primitives whose
XLA-mode rules (array_rules.py) use operations only XLA runs: pad with
interior or negative padding (XlaPad), dynamic slices (XlaDynamicSlice,
XlaDynamicUpdateSlice) and scatter (TensorFlow's ScatterNd kernels refuse
an index out of range, where XLA skips it)."""

import tensorflow as tf

from keras_ipu.device.to_tensorflow.array_rules import scatter_indices
from keras_ipu.device.to_tensorflow.array_rules import scatter_function
from keras_ipu.device.to_tensorflow.array_rules import starts_vector
from keras_ipu.device.to_tensorflow.emitter import EmitError
from keras_ipu.device.to_tensorflow.emitter import graph_rule


def static_shape(x, primitive):
    """x's shape as ints: the graph rules slice and reshape by the sizes
    (the engine's programs have static shapes; an export with an open
    size uses the XLA mode)."""
    shape = x.shape.as_list()
    if None in shape:
        raise EmitError(
            f"`{primitive}` on a value of shape {shape}: the graph mode needs "
            "static shapes."
        )
    return shape


def pad(x, value, config):
    """XLA's Pad (per axis (lo, hi, interior); interior first, a negative
    lo/hi crops) with TensorFlow's own kernels: without interior padding
    one slice for the crops and one Pad; with it, x written with a stride
    into a buffer filled with `value` (one strided slice update: a
    max-pool gradient pads each window tap's share this way), then the
    crops."""
    shape = static_shape(x, "pad")
    value = tf.cast(value, x.dtype)
    crop = any(lo < 0 or hi < 0 for lo, hi, _ in config)
    edges = [[max(lo, 0), max(hi, 0)] for lo, hi, _ in config]
    if any(interior for _, _, interior in config):
        spread = [(n - 1) * (h + 1) + 1 if n else 0 for n, (_, _, h) in zip(shape, config)]
        full = [lo + n + hi for n, (lo, hi) in zip(spread, edges)]
        if 0 in shape:
            x = tf.fill(full, value)
        else:
            begin = [lo for lo, _ in edges]
            x = tf.raw_ops.TensorStridedSliceUpdate(
                input=tf.fill(full, value), begin=begin,
                end=[b + n for b, n in zip(begin, spread)],
                strides=[h + 1 for _, _, h in config], value=x)
        if crop:
            x = x[tuple(slice(max(-lo, 0), n - max(-hi, 0))
                        for (lo, hi, _), n in zip(config, full))]
        return x
    if crop:
        x = x[tuple(slice(max(-lo, 0), n - max(-hi, 0))
                    for (lo, hi, _), n in zip(config, shape))]
    if any(lo or hi for lo, hi in edges):
        x = tf.pad(x, edges, constant_values=value)
    return x


@graph_rule("pad")
def _pad(ctx, x, padding_value, *, config):
    return pad(x, padding_value, config)


def _clamped_starts(ctx, starts, sizes):
    # XLA clamps the window inside the operand, as the kernel does.
    dims = ctx.in_avals[0].shape
    if None in dims:
        raise EmitError("dynamic slices in the graph mode need static shapes.")
    starts = starts_vector(starts)
    return tf.clip_by_value(starts, 0, tf.constant([d - s for d, s in zip(dims, sizes)],
                                                   tf.int32))


@graph_rule("dynamic_slice")
def _dynamic_slice(ctx, x, *starts, slice_sizes):
    return tf.slice(x, _clamped_starts(ctx, starts, slice_sizes), slice_sizes)


@graph_rule("dynamic_update_slice")
def _dynamic_update_slice(ctx, x, update, *starts):
    sizes = ctx.in_avals[1].shape
    begin = _clamped_starts(ctx, starts, sizes)
    return tf.raw_ops.TensorStridedSliceUpdate(
        input=x, begin=begin, end=begin + tf.constant(sizes, tf.int32),
        strides=tf.ones([len(sizes)], tf.int32), value=update)


@graph_rule("scatter")
def _scatter(ctx, x, indices, updates, *, mode, batch_dims=0):
    apply = scatter_function(mode)
    idx, valid = scatter_indices(ctx, x, indices, batch_dims)
    # Out-of-range rows are dropped (as XLA's scatter and the kernel do):
    # TensorFlow's kernels would refuse them, so they are left out.
    return apply(x, tf.boolean_mask(idx, valid), tf.boolean_mask(updates, valid))
