"""Graph-mode rules (emitter.py's `graph` mode) of dot_general,
conv_general_dilated and reduce_window: TensorFlow's own MatMul /
BatchMatMul, Conv2D / Conv3D / DepthwiseConv2dNative and MaxPool / AvgPool
kernels (oneDNN's on x86), where the XLA mode (contraction_rules.py) uses
XLA's DotGeneral, Conv and ReduceWindow, which TensorFlow runs only
through XLA. A case these kernels do not take raises EmitError: the
program then runs on another engine. Also large sums over leading axes,
as a product with a row of ones (TensorFlow's Sum is slow on them)."""

import numpy as np
import tensorflow as tf

from keras_ipu.device.primitives.conv import padding_for
from keras_ipu.device.primitives.conv import resolve_padding
from keras_ipu.device.primitives.dot import compute_dtype
from keras_ipu.device.primitives.dot import split_dimensions
from keras_ipu.device.primitives.pooling import identity
from keras_ipu.device.to_tensorflow.array_rules import product_sum_rule
from keras_ipu.device.to_tensorflow.array_rules import transpose
from keras_ipu.device.to_tensorflow.array_rules import transposed_before
from keras_ipu.device.to_tensorflow.contraction_rules import canonical_conv
from keras_ipu.device.to_tensorflow.emitter import EmitError
from keras_ipu.device.to_tensorflow.emitter import graph_rule
from keras_ipu.device.to_tensorflow.emitter import tf_dtype
from keras_ipu.device.to_tensorflow.graph_array_rules import pad
from keras_ipu.device.to_tensorflow.graph_array_rules import static_shape
from keras_ipu.device.to_tensorflow.pooling_rules import PoolLayout

# The dtypes TensorFlow's CPU MatMul / BatchMatMulV2 / Conv2D kernels take;
# bool and other integers are computed in int64 (the same wrapped result:
# integer products and sums are exact modulo 2**bits; bool is nonzero).
_MATMUL_DTYPES = {np.dtype(t) for t in ("float32", "float64", "int32", "int64")}
_CONV_DTYPES = {np.dtype(t) for t in ("float32", "float64")}


def _work_dtype(out_dtype, supported):
    """The dtype a product is computed in: the NumPy kernel's (half floats
    accumulate in float32, primitives/dot.py), bool and small integers
    in int32/int64."""
    work, _ = compute_dtype(np.dtype(out_dtype), None)
    if work in supported:
        return work
    if work.kind in "biu" and np.dtype(np.int64) in supported:
        return np.dtype(np.int64)
    raise EmitError(f"no TensorFlow CPU kernel computes this product in {work}.")


def _from_work(out, out_dtype):
    out_dtype = np.dtype(out_dtype)
    if out_dtype.kind == "b":
        return tf.not_equal(out, tf.zeros((), out.dtype))
    return out if out.dtype == tf_dtype(out_dtype) else tf.cast(out, tf_dtype(out_dtype))


def _size(shape, axes):
    return int(np.prod([shape[a] for a in axes], dtype=np.int64))


def _matrix(x, shape, batch, rows, cols):
    """x as a [B, rows, cols] (or [rows, cols]) matrix for MatMul, and
    whether MatMul reads it transposed: axes laid out batch-rows-cols
    need only a reshape, batch-cols-rows a reshape and the kernel's
    transpose flag, any other order a transpose first, to whichever of
    the two orders an earlier product transposed x to (one Transpose for
    both: attention's keys are read contracted over their features
    forward and over the sequence backward)."""
    b = (_size(shape, batch),) if batch else ()
    order = tuple(batch) + tuple(rows) + tuple(cols)
    flipped = tuple(batch) + tuple(cols) + tuple(rows)
    identity = tuple(range(len(shape)))
    if order == identity:
        return tf.reshape(x, b + (_size(shape, rows), _size(shape, cols))), False
    if flipped == identity or (transposed_before(x, flipped)
                               and not transposed_before(x, order)):
        if flipped != identity:
            x = transpose(x, flipped, shape)
        return tf.reshape(x, b + (_size(shape, cols), _size(shape, rows))), True
    x = transpose(x, order, shape)
    return tf.reshape(x, b + (_size(shape, rows), _size(shape, cols))), False


@graph_rule("dot_general")
def _dot_general(ctx, lhs, rhs, *, dimension_numbers, preferred_element_type=None):
    lhs_shape, rhs_shape = (a.shape for a in ctx.in_avals)
    if None in lhs_shape or None in rhs_shape:
        raise EmitError("dot_general in the graph mode needs static shapes.")
    lc, rc, lb, rb, lf, rf = split_dimensions(len(lhs_shape), len(rhs_shape),
                                              dimension_numbers)
    out_dtype = ctx.out_aval.dtype
    work = tf_dtype(_work_dtype(out_dtype, _MATMUL_DTYPES))
    lhs = lhs if lhs.dtype == work else tf.cast(lhs, work)
    rhs = rhs if rhs.dtype == work else tf.cast(rhs, work)
    # (B, M, K) @ (B, K, N), as the NumPy kernel; MatMul's transpose flags
    # stand for the layouts a reshape gives directly.
    a, transpose_a = _matrix(lhs, lhs_shape, lb, lf, lc)
    b, transpose_b = _matrix(rhs, rhs_shape, rb, rc, rf)
    if lb and transpose_a and _size(lhs_shape, lf) > _size(rhs_shape, rf):
        # Eigen's BatchMatMul reads a transposed left operand slowly, the
        # more so the larger it is (attention's key gradient, probabilities
        # (64 x 64) transposed times queries (64 x 16), 512 times: 8.8 ms of
        # CPU on this host): the transposed product b^T a reads the smaller
        # operand transposed instead, and its transpose is the result
        # (6.9 ms with that Transpose; the same bits).
        out = tf.linalg.matmul(b, a, transpose_a=not transpose_b)
        out = tf.transpose(out, (0, 2, 1))
    else:
        out = tf.linalg.matmul(a, b, transpose_a=transpose_a, transpose_b=transpose_b)
    out = tf.reshape(out, ctx.out_aval.shape)
    return _from_work(out, out_dtype)


def _conv_valid_or_padded(x, w, strides, padding, dilations):
    """A canonical (N, S..., C) x (S..., I, O) convolution of 1 to 3
    spatial dims, non-negative padding, no groups."""
    nsp = len(strides)
    if nsp == 1:  # as a 2-d convolution over a height of one
        out = _conv_valid_or_padded(tf.expand_dims(x, 1), tf.expand_dims(w, 0),
                                    (1,) + tuple(strides), ((0, 0),) + tuple(padding),
                                    (1,) + tuple(dilations))
        return tf.squeeze(out, 1)
    if nsp == 2:
        explicit = [[0, 0]] + [list(p) for p in padding] + [[0, 0]]
        return tf.nn.conv2d(x, w, strides=[1, *strides, 1], padding=explicit,
                            dilations=[1, *dilations, 1])
    if nsp == 3:
        if any(d != 1 for d in dilations):
            raise EmitError("TensorFlow's CPU Conv3D takes no dilation.")
        if any(p != (0, 0) for p in padding):
            x = tf.pad(x, [[0, 0]] + [list(p) for p in padding] + [[0, 0]])
        return tf.nn.conv3d(x, w, strides=[1, *strides, 1], padding="VALID")
    raise EmitError(f"no TensorFlow convolution of {nsp} spatial dims.")


def _depthwise(x, w, strides, padding, dilations):
    """A convolution with one group per input channel (kernel in-features
    1): DepthwiseConv2dNative, the kernel's outputs grouped by channel as
    XLA's groups are (output o in group o // multiplier)."""
    nsp = len(strides)
    if nsp == 1:
        # Over a height of one (kernel height one, no padding) any height
        # stride gives one row: the width's, so that the strides are equal
        # and need no subsampling below.
        out = _depthwise(tf.expand_dims(x, 1), tf.expand_dims(w, 0),
                         (strides[0],) + tuple(strides), ((0, 0),) + tuple(padding),
                         (1,) + tuple(dilations))
        return tf.squeeze(out, 1)
    if nsp != 2:
        raise EmitError("TensorFlow has depthwise convolutions of 2 spatial dims only.")
    kh, kw, _, o = static_shape(w, "conv_general_dilated")
    channels = static_shape(x, "conv_general_dilated")[-1]
    w = tf.reshape(w, (kh, kw, channels, o // channels))
    if any(p != (0, 0) for p in padding):
        x = tf.pad(x, [[0, 0]] + [list(p) for p in padding] + [[0, 0]])
    if strides[0] != strides[1]:
        # Eigen's DepthwiseConv2dNative (no oneDNN, as on AMD hosts) takes
        # equal strides only: the stride-1 result, then every stride-th
        # output.
        out = tf.nn.depthwise_conv2d(x, w, strides=[1, 1, 1, 1], padding="VALID",
                                     dilations=list(dilations))
        return out[:, ::strides[0], ::strides[1], :]
    return tf.nn.depthwise_conv2d(x, w, strides=[1, *strides, 1], padding="VALID",
                                  dilations=list(dilations))


def _filter_gradient(ctx, lhs, rhs, window_strides, padding, lhs_dilation,
                     rhs_dilation, dimension_numbers, feature_group_count):
    """A 2-d convolution's weight gradient as Conv2DBackpropFilter, or None
    when the convolution is not one. The autodiff writes it as a
    convolution whose window is the output gradient (grads/conv.py: the
    forward input with batch and feature swapped, the forward stride as
    the window's dilation): as such oneDNN runs a window of the image's
    size, a multiple of the backprop kernel's time."""
    lhs_spec, rhs_spec, out_spec = dimension_numbers
    lhs_aval, rhs_aval = ctx.in_avals
    in_sp = [lhs_aval.shape[a] for a in lhs_spec[2:]]
    window = [rhs_aval.shape[a] for a in rhs_spec[2:]]
    out_sp = [ctx.out_aval.shape[a] for a in out_spec[2:]]
    if (len(in_sp) != 2 or feature_group_count != 1 or None in in_sp
            or any(d != 1 for d in lhs_dilation) or any(d != 1 for d in window_strides)
            or np.prod(window) <= np.prod(out_sp)):
        return None
    padding = resolve_padding(padding, in_sp, window, window_strides, lhs_dilation,
                              rhs_dilation)
    if any(lo < 0 or hi < 0 for lo, hi in padding):
        return None
    # The forward convolution's sizes must give the window (its output).
    strides = rhs_dilation
    if any((n + lo + hi - k) // s + 1 != w
           for n, k, w, s, (lo, hi) in zip(in_sp, out_sp, window, strides, padding)):
        return None
    channels, features = lhs_aval.shape[lhs_spec[0]], rhs_aval.shape[rhs_spec[0]]
    # Forward input (N, H, W, C): our feature role is its batch, our batch
    # role its channels; output gradient (N, P, Q, O) likewise.
    x_order = (lhs_spec[1], *lhs_spec[2:], lhs_spec[0])
    dy_order = (rhs_spec[1], *rhs_spec[2:], rhs_spec[0])
    x = lhs if x_order == tuple(range(4)) else tf.transpose(lhs, x_order)
    dy = rhs if dy_order == tuple(range(4)) else tf.transpose(rhs, dy_order)
    out_dtype = ctx.out_aval.dtype
    work = tf_dtype(_work_dtype(out_dtype, _CONV_DTYPES))
    x = x if x.dtype == work else tf.cast(x, work)
    dy = dy if dy.dtype == work else tf.cast(dy, work)
    # TensorFlow's CPU kernel takes SAME and VALID padding on its fast
    # path and explicit padding on a slower one (3-4x the CPU time for the
    # benchmark CNN's layers on this host): other padding is added first.
    if tuple(padding) == padding_for("SAME", in_sp, out_sp, strides):
        mode = "SAME"
    else:
        if any(p != (0, 0) for p in padding):
            x = tf.pad(x, [[0, 0], *[list(p) for p in padding], [0, 0]])
        mode = "VALID"
    grad = tf.raw_ops.Conv2DBackpropFilter(
        input=x, filter_sizes=tf.constant(out_sp + [channels, features], tf.int32),
        out_backprop=dy, strides=[1, *strides, 1], padding=mode)
    # grad's axes (KH, KW, C, O) are our spatial, batch and feature roles.
    perm = [0] * 4
    for grad_axis, axis in enumerate((*out_spec[2:], out_spec[0], out_spec[1])):
        perm[axis] = grad_axis
    return _from_work(tf.transpose(grad, perm), out_dtype)


@graph_rule("conv_general_dilated")
def _conv(ctx, lhs, rhs, *, window_strides, padding, lhs_dilation, rhs_dilation,
          dimension_numbers, feature_group_count):
    grad = _filter_gradient(ctx, lhs, rhs, window_strides, padding, lhs_dilation,
                            rhs_dilation, dimension_numbers, feature_group_count)
    if grad is not None:
        return grad
    lhs, rhs, padding, restore = canonical_conv(
        ctx, lhs, rhs, padding, window_strides, lhs_dilation, rhs_dilation,
        dimension_numbers)
    out_dtype = ctx.out_aval.dtype
    work = tf_dtype(_work_dtype(out_dtype, _CONV_DTYPES))
    lhs = lhs if lhs.dtype == work else tf.cast(lhs, work)
    rhs = rhs if rhs.dtype == work else tf.cast(rhs, work)
    nsp = len(window_strides)
    # The input's dilation (a strided convolution's input gradient) and any
    # cropping as explicit holes and slices: the kernels take neither.
    if any(d != 1 for d in lhs_dilation) or any(lo < 0 or hi < 0 for lo, hi in padding):
        config = ((0, 0, 0),) + tuple((lo, hi, d - 1) for (lo, hi), d
                                      in zip(padding, lhs_dilation)) + ((0, 0, 0),)
        lhs = pad(lhs, tf.zeros((), work), config)
        padding = ((0, 0),) * nsp
    strides = tuple(window_strides)
    # TensorFlow's CPU kernels take a dilated window only at stride 1: the
    # stride-1 result, then every stride-th output.
    subsample = any(s != 1 for s in strides) and any(d != 1 for d in rhs_dilation)
    if subsample:
        strides = (1,) * nsp
    groups = feature_group_count
    kernel_in = static_shape(rhs, "conv_general_dilated")[nsp]
    if groups == 1:
        out = _conv_valid_or_padded(lhs, rhs, strides, padding, rhs_dilation)
    elif kernel_in == 1:
        out = _depthwise(lhs, rhs, strides, padding, rhs_dilation)
    else:  # one convolution per group, concatenated as XLA orders them
        parts = zip(tf.split(lhs, groups, axis=-1), tf.split(rhs, groups, axis=-1))
        out = tf.concat([_conv_valid_or_padded(x, w, strides, padding, rhs_dilation)
                         for x, w in parts], axis=-1)
    if subsample:
        out = out[(slice(None),) + tuple(slice(None, None, s) for s in window_strides)]
    return restore(_from_work(out, out_dtype))


# Sums over leading axes of at least this many elements are emitted as a
# MatMul of a row of ones by the operand seen as (rows, columns).
# TensorFlow's Sum kernel keeps the inner axes by striding down the outer
# ones; the product is oneDNN's vectorised, threaded GEMM. Process CPU ms
# per sum at 2 threads on this host (issue 16, eighth pass; the call's own
# ~0.2 ms included): 128x32x32x32 over (0, 1, 2) 5.1 -> 1.2, 128x16x16x64
# 3.0 -> 1.1, 8192x128 over 0 1.4 -> 0.9, 4096x64 0.43 -> 0.32; 128x512
# (64K elements) and below, no gain (0.22 -> 0.24). These are BatchNormalization's
# statistics and their gradients, and bias gradients. The order of the
# additions changes (blocked in the GEMM, row by row in NumPy's kernel):
# the values agree within float rounding, not to the bit.
COLUMN_SUM_MIN_ELEMENTS = 1 << 17


def _column_sum(x, rows, cols):
    return tf.linalg.matmul(tf.ones((1, rows), x.dtype), tf.reshape(x, (rows, cols)))


graph_rule("reduce_sum")(product_sum_rule(COLUMN_SUM_MIN_ELEMENTS, leading=_column_sum))


_POOLS = {"max": tf.nn.max_pool, "sum": tf.nn.avg_pool}


@graph_rule("reduce_window")
def _reduce_window(ctx, x, *, op, window_dimensions, window_strides, padding,
                   base_dilation, window_dilation):
    """MaxPool / AvgPool (a sum: the average times the window's size) over
    the windowed axes, the others folded into the pool's batch (those
    before the last windowed axis) and channels (those after it)."""
    aval = ctx.in_avals[0]
    dtype = np.dtype(aval.dtype)
    if dtype.kind != "f" or op not in ("max", "sum", "min"):
        raise EmitError(f"reduce_window {op} of {dtype} has no TensorFlow pool kernel.")
    if any(d != 1 for d in window_dilation):
        raise EmitError("TensorFlow's pools take no window dilation.")
    padding = resolve_padding(padding, aval.shape, window_dimensions,
                              window_strides, base_dilation, window_dilation)
    work = tf.float32 if dtype.itemsize < 4 else x.dtype  # as the kernel's half sums
    x = x if x.dtype == work else tf.cast(x, work)
    if op == "min":
        x = -x
    # The padding and the dilation's holes hold the reduction's identity.
    config = tuple((lo, hi, d - 1) for (lo, hi), d in zip(padding, base_dilation))
    if any(c != (0, 0, 0) for c in config):
        fill = identity("max" if op == "min" else op, np.dtype(work.as_numpy_dtype))
        x = pad(x, tf.constant(fill, work), config)
    layout = PoolLayout(static_shape(x, "reduce_window"), window_dimensions,
                        window_strides)
    windowed = layout.windowed
    if not windowed:
        out = x
    else:
        if len(windowed) > 3:
            raise EmitError("TensorFlow's pools window at most 3 axes.")
        ksize = [window_dimensions[a] for a in windowed]
        strides = [window_strides[a] for a in windowed]
        pooled = _POOLS[op if op != "min" else "max"](
            layout.to_pool(x), ksize=ksize, strides=strides, padding="VALID")
        if op == "sum":
            pooled = pooled * tf.constant(float(np.prod(ksize)), work)
        out = layout.from_pool(pooled, static_shape(pooled, "reduce_window")[1:-1])
    if op == "min":
        out = -out
    return out if out.dtype == tf_dtype(dtype) else tf.cast(out, tf_dtype(dtype))
