"""Graph-mode rules (emitter.py's `graph` mode) of the array primitives whose
XLA-mode rules (array_rules.py) use operations only XLA runs: pad with
interior or negative padding (XlaPad), dynamic slices (XlaDynamicSlice,
XlaDynamicUpdateSlice) and scatter (TensorFlow's ScatterNd kernels refuse
an index out of range, where XLA skips it)."""

import tensorflow as tf

from keras_ipu.device.to_tensorflow.array_rules import scatter_indices
from keras_ipu.device.to_tensorflow.array_rules import scatter_function
from keras_ipu.device.to_tensorflow.array_rules import starts_vector
from keras_ipu.device.to_tensorflow.control_flow_rules import stacked_array
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


def _spread(x, shape, holes, first, value):
    """x with `holes[a]` copies of `value` after each element along each
    axis a, `first[a]` of them moved before it: a new axis of one after
    each spread axis, padded (first, holes - first), merged back by a
    reshape. One Pad of contiguous runs: TensorFlow's strided writes
    (TensorStridedSliceUpdate) took 7x as long for a max-pool gradient's
    128x16x16x32 -> 128x32x32x32 on this host."""
    expanded, edges, merged = [], [], []
    for n, h, a in zip(shape, holes, first):
        expanded.append(n)
        edges.append([0, 0])
        merged.append(n * (h + 1))
        if h:
            expanded.append(1)
            edges.append([a, h - a])
    x = tf.pad(tf.reshape(x, expanded), edges, constant_values=value)
    return tf.reshape(x, merged)


def pad(x, value, config):
    """XLA's Pad (per axis (lo, hi, interior); interior first, a negative
    lo/hi crops) with TensorFlow's own kernels: the interior holes spread
    by one Pad (_spread, which also places up to a hole's worth of lo),
    then one slice for the crops and one Pad for the remaining edges."""
    shape = static_shape(x, "pad")
    value = tf.cast(value, x.dtype)
    edges = [[lo, hi] for lo, hi, _ in config]
    if any(h and n for (_, _, h), n in zip(config, shape)):
        holes = [h if n else 0 for (_, _, h), n in zip(config, shape)]
        first = [min(max(lo, 0), h) for (lo, _, _), h in zip(config, holes)]
        x = _spread(x, shape, holes, first, value)
        # The spread placed `first` holes before and `h - first` after.
        edges = [[lo - a, hi - (h - a)] for (lo, hi), h, a in zip(edges, holes, first)]
        shape = static_shape(x, "pad")
    if any(lo < 0 or hi < 0 for lo, hi in edges):
        x = x[tuple(slice(max(-lo, 0), n - max(-hi, 0)) for (lo, hi), n in zip(edges, shape))]
    edges = [[max(lo, 0), max(hi, 0)] for lo, hi in edges]
    if any(lo or hi for lo, hi in edges):
        x = tf.pad(x, edges, constant_values=value)
    return x


def _one_step(x, shape, start_indices, limit_indices, strides):
    """x[i:i+1] read from the TensorArray a scan stacked x from, when x is
    one and the slice takes one whole step (an RNN's last output): the
    stack is then left out when nothing else reads it."""
    array = stacked_array(x, shape[0]) if shape else None
    if array is None:
        return None
    ranges = [slice(s, l, st).indices(n)
              for n, s, l, st in zip(shape, start_indices, limit_indices, strides)]
    (first, stop, stride), rest = ranges[0], ranges[1:]
    if (stop - first != 1 or stride != 1
            or any(r != (0, n, 1) for r, n in zip(rest, shape[1:]))):
        return None
    return tf.expand_dims(array.read(first), 0)


@graph_rule("slice")
def _slice(ctx, x, *, start_indices, limit_indices, strides):
    """A strided slice as unit-stride ones: every stride-th element of a
    run is the first of each row of the run reshaped to (m, stride).
    TensorFlow's StridedSlice with strides copies element by element (8x
    the time of this for a max-pool gradient's taps on this host)."""
    shape = static_shape(x, "slice")
    one = _one_step(x, shape, start_indices, limit_indices, strides)
    if one is not None:
        return one
    begin, end, outer, inner = [], [], [], []
    short = []
    for n, s, l, st in zip(shape, start_indices, limit_indices, strides):
        s, l, _ = slice(s, l, st).indices(n)
        m = max(0, -(-(l - s) // st))
        begin.append(s)
        end.append(min(s + m * st, n))
        short.append(s + m * st - end[-1])  # the last row's missing tail
        outer.extend((m, st) if st > 1 else (m,))
        inner.append(st)
    x = tf.strided_slice(x, begin, end)
    if any(short):
        x = tf.pad(x, [[0, k] for k in short])
    if all(st == 1 for st in strides):
        return x
    x = tf.reshape(x, outer)
    keep = []
    for st in inner:
        keep.append(slice(None))
        if st > 1:
            keep.append(slice(0, 1))
    return tf.reshape(x[tuple(keep)], ctx.out_aval.shape)


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
