"""TensorFlow rules of the primitives that move, select or place values
(primitives/structure.py, indexing.py, reduce.py, cumulative.py, sort.py).
"""

import numpy as np
import tensorflow as tf
from tensorflow.compiler.tf2xla.python import xla as tfxla

from keras_ipu.device.primitives.indexing import default_fill
from keras_ipu.device.to_tensorflow.emitter import EmitError
from keras_ipu.device.to_tensorflow.emitter import dynamic_shape
from keras_ipu.device.to_tensorflow.emitter import rule
from keras_ipu.device.to_tensorflow.emitter import tf_dtype
from keras_ipu.device.to_tensorflow.emitter import unknown_dimension_error
from keras_ipu.device.to_tensorflow.emitter import xla_rule


def _unknown_from_operand(ctx, x, name):
    """The output shape, its unknown dimensions read from the operand `x`
    where they line up with its own unknown dimensions (counted from the
    right, as broadcasting aligns them); one left over is -1 (reshape)."""
    out, src = ctx.out_aval.shape, ctx.in_avals[0].shape
    if None not in out:
        return out
    offset = len(out) - len(src)
    runtime = tf.shape(x)
    shape, free = [], []
    for i, d in enumerate(out):
        j = i - offset
        if d is not None:
            shape.append(d)
        elif 0 <= j < len(src) and src[j] is None and all(
                out[k] == src[k - offset] for k in range(max(offset, 0), i)):
            shape.append(runtime[j])
        else:
            free.append(i)
            shape.append(-1)
    if len(free) > (1 if name == "reshape" else 0):
        raise unknown_dimension_error(name, out)
    return shape


@rule("reshape")
def _reshape(ctx, x, *, new_shape):
    return tf.reshape(x, _unknown_from_operand(ctx, x, "reshape"))


@rule("broadcast_to")
def _broadcast_to(ctx, x, *, shape):
    return tf.broadcast_to(x, _unknown_from_operand(ctx, x, "broadcast_to"))


def transpose(x, permutation, shape):
    """x (of static or partly known `shape`) transposed; a reshape when the
    permutation moves only axes of one element (the others keep their
    order, so the data's order is unchanged): TensorFlow's graph runtime
    copies for any Transpose (attention's scores, 128x4x64x1x64 with the
    unit axis moved: 8 MB per step each way in the benchmark
    transformer)."""
    moved = [a for a in permutation if shape[a] != 1]
    if moved == sorted(moved) and None not in shape:
        return tf.reshape(x, [shape[a] for a in permutation])
    # One Transpose per value and permutation in a graph: TensorFlow's
    # runtime ran the same one twice (attention's keys, values and queries
    # are read by a forward and a backward product each).
    made = _transposes()
    key = (x.ref(), tuple(int(a) for a in permutation))
    if key not in made:
        made[key] = tf.transpose(x, permutation)
    return made[key]


def _transposes():
    graph = tf.compat.v1.get_default_graph()
    if not hasattr(graph, "_keras_ipu_transposes"):
        graph._keras_ipu_transposes = {}
    return graph._keras_ipu_transposes


def transposed_before(x, permutation):
    """Whether `transpose` made x transposed by `permutation` in this graph."""
    return (x.ref(), tuple(int(a) for a in permutation)) in _transposes()


@rule("transpose")
def _transpose(ctx, x, *, permutation):
    return transpose(x, permutation, ctx.in_avals[0].shape)


@rule("concatenate")
def _concatenate(ctx, *xs, axis):
    return tf.concat(xs, axis=axis % ctx.out_aval.ndim)


@xla_rule("pad")
def _pad(ctx, x, padding_value, *, config):
    lo = [c[0] for c in config]
    hi = [c[1] for c in config]
    interior = [c[2] for c in config]
    return tfxla.pad(x, padding_value, lo, hi, interior)


@rule("rev")
def _rev(ctx, x, *, axes):
    if not axes:
        return x
    return tf.reverse(x, [a % ctx.out_aval.ndim for a in axes])


@rule("iota")
def _iota(ctx, *, dtype, shape, dimension):
    if None in shape:
        raise unknown_dimension_error("iota", shape)
    n = shape[dimension]
    ramp = tf.range(n, dtype=tf_dtype(dtype))
    ramp = tf.reshape(ramp, tuple(n if i == dimension else 1 for i in range(len(shape))))
    return tf.broadcast_to(ramp, shape)


@xla_rule("slice")
def _slice(ctx, x, *, start_indices, limit_indices, strides):
    if None in ctx.in_avals[0].shape:
        # Python slice rules on a dimension known only at run time, as the
        # primitive's params are written (None: the end; negative: from it).
        return x[tuple(slice(s, l, st) for s, l, st in
                       zip(start_indices, limit_indices, strides))]
    begin, end = [], []
    for d, s, l, st in zip(ctx.in_avals[0].shape, start_indices, limit_indices, strides):
        s, l, _ = slice(s, l, st).indices(d)
        begin.append(s)
        end.append(max(l, s))
    return tf.strided_slice(x, begin, end, strides)


def starts_vector(starts):
    """The scalar start operands of a dynamic slice as one int32 vector."""
    return tf.stack([tf.cast(s, tf.int32) for s in starts]) if starts else tf.zeros((0,), tf.int32)


@xla_rule("dynamic_slice")
def _dynamic_slice(ctx, x, *starts, slice_sizes):
    # XLA clamps the window inside the operand, as the kernel does.
    return tfxla.dynamic_slice(x, starts_vector(starts), slice_sizes)


@xla_rule("dynamic_update_slice")
def _dynamic_update_slice(ctx, x, update, *starts):
    return tfxla.dynamic_update_slice(x, update, starts_vector(starts))


def _indices(ctx, x_shape, indices, batch_dims):
    """The kernel's index rule as tf.gather_nd indices: negative counts
    from the end; batch axes become explicit leading index columns."""
    k = ctx.in_avals[1].shape[-1]
    indexed = x_shape[batch_dims:batch_dims + k]
    if all(isinstance(d, int) for d in indexed):
        dims = tf.constant(np.asarray(indexed), indices.dtype)
    else:  # sizes known at run time only (dynamic_shape)
        dims = tf.cast(tf.stack(indexed), indices.dtype)
    idx = tf.where(indices < 0, indices + dims, indices)
    valid = tf.reduce_all((idx >= 0) & (idx < dims), axis=-1)
    return idx, dims, valid


def _with_batch(idx, batch_dims, x_shape):
    """Index columns for the batch axes prepended (gather_nd with full
    indices works for scatter too)."""
    if not batch_dims:
        return idx
    shape = dynamic_shape(idx, tuple(idx.shape))
    cols = []
    for j in range(batch_dims):
        view = [1] * (len(shape) - 1)
        view[j] = x_shape[j]
        ramp = tf.reshape(tf.range(x_shape[j], dtype=idx.dtype), view)
        cols.append(tf.broadcast_to(ramp, shape[:-1])[..., None])
    return tf.concat(cols + [idx], axis=-1)


@rule("gather")
def _gather(ctx, x, indices, *, mode, fill_value=None, batch_dims=0):
    x_shape = dynamic_shape(x, ctx.in_avals[0].shape)
    idx, dims, valid = _indices(ctx, x_shape, indices, batch_dims)
    idx = tf.clip_by_value(idx, tf.zeros((), idx.dtype), tf.maximum(dims - 1, 0))
    out = tf.gather_nd(x, _with_batch(idx, batch_dims, x_shape))
    if mode == "fill":
        dtype = ctx.out_aval.dtype
        fill = default_fill(dtype) if fill_value is None else fill_value
        fill = tf.constant(np.asarray(fill).astype(dtype))
        mask = tf.reshape(valid, tuple(dynamic_shape(valid, tuple(valid.shape)))
                          + (1,) * (out.shape.rank - valid.shape.rank))
        out = tf.where(mask, out, fill)
    return out


_SCATTERS = {
    "update": tf.tensor_scatter_nd_update,
    "add": tf.tensor_scatter_nd_add,
    "min": tf.tensor_scatter_nd_min,
    "max": tf.tensor_scatter_nd_max,
}


def scatter_function(mode):
    """TensorFlow's scatter of the primitive's `mode`."""
    if mode not in _SCATTERS:  # TensorFlow has no tensor_scatter_nd_mul
        raise EmitError(f"scatter mode {mode!r} has no TensorFlow rule")
    return _SCATTERS[mode]


def scatter_indices(ctx, x, indices, batch_dims):
    """(indices, valid): the kernel's index rule as tensor_scatter_nd
    indices (batch columns included), and which rows are in range. The
    kernel drops the others: their indices point just past the operand,
    which XLA's scatter skips."""
    x_shape = dynamic_shape(x, ctx.in_avals[0].shape)
    idx, dims, valid = _indices(ctx, x_shape, indices, batch_dims)
    idx = tf.where(valid[..., None], idx, tf.broadcast_to(dims, tf.shape(idx)))
    return _with_batch(idx, batch_dims, x_shape), valid


@xla_rule("scatter")
def _scatter(ctx, x, indices, updates, *, mode, batch_dims=0):
    apply = scatter_function(mode)
    idx, _ = scatter_indices(ctx, x, indices, batch_dims)
    return apply(x, idx, updates)


@rule("stop_gradient")
def _stop_gradient(ctx, x):
    return tf.stop_gradient(x)


@rule("optimization_barrier")
def _barrier(ctx, *xs):
    return tuple(xs)


# Their value is their operand: the markers for the compiler
# (primitives/markers.py), and a copy between IPUs (primitives/inter_ipu.py),
# since one host runs every IPU's part.
@rule("recomputation_checkpoint", "assume_equal_across_replicas", "ipu_copy")
def _pass_through(ctx, x, **params):
    return x


_REDUCERS = {
    "reduce_sum": tf.math.reduce_sum,
    "reduce_prod": tf.math.reduce_prod,
    "reduce_max": tf.math.reduce_max,
    "reduce_min": tf.math.reduce_min,
    "reduce_and": tf.math.reduce_all,
    "reduce_or": tf.math.reduce_any,
}


def _reduction(fn, name):
    def emit(ctx, x, *, axes):
        if not axes:
            return x
        if x.dtype == tf.bool and name in ("reduce_sum", "reduce_prod", "reduce_max", "reduce_min"):
            out = fn(tf.cast(x, tf.uint8), axis=list(axes))
            return tf.cast(out, tf.bool)
        if name in ("reduce_and", "reduce_or") and x.dtype != tf.bool:
            x = tf.not_equal(x, tf.zeros((), x.dtype))
        out = fn(x, axis=list(axes))
        dtype = tf_dtype(ctx.out_aval.dtype)
        return out if out.dtype == dtype else tf.cast(out, dtype)

    return emit


for _name, _fn in _REDUCERS.items():
    if _name != "reduce_sum":
        rule(_name)(_reduction(_fn, _name))
# reduce_sum's rule in both modes for the sums each does not compute as a
# product with ones (product_sum_rule).
_sum_rule = _reduction(tf.math.reduce_sum, "reduce_sum")
_PRODUCT_SUM_DTYPES = frozenset({np.dtype(np.float32), np.dtype(np.float64)})


def sum_as_product(aval, axes, min_elements, trailing):
    """How both modes' reduce_sum rules compute a large sum as a product
    with ones (graph_contraction_rules.py, contraction_rules.py): (rows,
    cols, side), a value of `aval` seen as a (rows, cols) matrix whose axis
    `side` is summed (0: `axes` are its leading axes; 1: its trailing ones,
    taken only where `trailing`), or None where the sum is left to
    TensorFlow's Sum: over none or all of its axes, of a shape unknown at
    trace time, of a dtype other than float32 and float64, or of fewer
    than `min_elements` elements (each mode's own, where its product
    paid)."""
    shape, n, k = aval.shape, len(aval.shape), len(axes)
    if not (0 < k < n and None not in shape and np.dtype(aval.dtype) in _PRODUCT_SUM_DTYPES
            and int(np.prod(shape)) >= min_elements):
        return None
    axes = tuple(sorted(axes))
    if axes == tuple(range(k)):
        side, split = 0, k
    elif trailing and axes == tuple(range(n - k, n)):
        side, split = 1, n - k
    else:
        return None
    return int(np.prod(shape[:split])), int(np.prod(shape[split:])), side


def product_sum_rule(min_elements, leading, trailing=None):
    """A mode's reduce_sum rule: the sums sum_as_product takes (with
    `min_elements`) as the mode's own products with ones, reshaped to the
    result, x seen as (rows, cols): over leading axes `leading(x, rows,
    cols)`, the sum down each column; over trailing ones `trailing(x, rows,
    cols)`, the sum along each row (None: the mode leaves those to Sum);
    any other as TensorFlow's Sum."""
    products = (leading, trailing)

    def emit(ctx, x, *, axes):
        as_product = sum_as_product(ctx.in_avals[0], axes, min_elements, trailing is not None)
        if as_product is None:
            return _sum_rule(ctx, x, axes=axes)
        rows, cols, side = as_product
        return tf.reshape(products[side](x, rows, cols), ctx.out_aval.shape)

    return emit


def _arg(fn):
    def emit(ctx, x, *, axis, index_dtype):
        return fn(x, axis=axis, output_type=tf_dtype(index_dtype))

    return emit


rule("argmax")(_arg(tf.math.argmax))
rule("argmin")(_arg(tf.math.argmin))


def _cumulative(fn):
    def emit(ctx, x, *, axis, reverse=False):
        return fn(x, axis=axis, reverse=reverse)

    return emit


rule("cumsum")(_cumulative(tf.math.cumsum))
rule("cumprod")(_cumulative(tf.math.cumprod))


@rule("top_k")
def _top_k(ctx, x, *, k, index_dtype=np.dtype(np.int32)):
    values, indices = tf.math.top_k(x, k=k, sorted=True)
    return values, tf.cast(indices, tf_dtype(index_dtype))
