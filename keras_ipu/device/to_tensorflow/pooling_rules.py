"""The rule of select_and_scatter_add (a max or min pool's gradient) in both
modes: TensorFlow's MaxPoolGrad / MaxPool3DGrad, which its graph runtime
runs as one kernel (oneDNN's on x86) and XLA compiles as its
select-and-scatter. Before the primitive existed the autodiff wrote the
gradient per window tap (strided views, compares, selects, zero pads:
about a third of the CNN benchmark's op time on the graph runtime, issue
16); Keras' TensorFlow backend runs one MaxPoolGrad.

Both kernels give a window's cotangent to its first maximum in row-major
window order, as the NumPy kernel does (ties: tests/compiler/
test_xla_engine.py), except the graph runtime's MaxPool3DGrad without
oneDNN (Eigen's credits every tied maximum: such programs run elsewhere).
Padding is given the pool's identity here, so where a window's values
are all that identity (-inf for max) these kernels may credit a padding
cell, where the NumPy kernel and XLA's select-and-scatter credit the
first real element. They recompute the maximum from the operand; the
primitive's window results are the reduce_window of that operand, so the
choice is the same (a NaN window result differs: NumPy gives no element
the cotangent, these kernels pick a number).

Also the layout shared with the forward pool rule (graph_contraction_rules.py):
the windowed axes become a pool's spatial axes, the others folded into
its batch (those before the last windowed axis) and channels (after)."""

import numpy as np
import tensorflow as tf

from keras_ipu.device.primitives.conv import resolve_padding
from keras_ipu.device.primitives.pooling import identity
from keras_ipu.device.to_tensorflow.emitter import EmitError
from keras_ipu.device.to_tensorflow.emitter import rule
from keras_ipu.device.to_tensorflow.emitter import tf_dtype
from keras_ipu.device.to_tensorflow.onednn import onednn_enabled


class PoolLayout:
    """How an array of `shape` pooled with a window over some of its axes
    is laid out for TensorFlow's pools: `to_pool(x)` is x as
    (batch, spatial..., channels), `from_pool(p, spatial)` a pool-shaped
    result (spatial sizes `spatial`) back in x's axis order."""

    def __init__(self, shape, window_dimensions, window_strides):
        self.shape = list(shape)
        self.windowed = [a for a in range(len(shape))
                         if window_dimensions[a] != 1 or window_strides[a] != 1]
        last = self.windowed[-1] if self.windowed else -1
        self.before = [a for a in range(last) if a not in self.windowed]
        self.after = list(range(last + 1, len(shape)))
        self.order = self.before + self.windowed + self.after
        self.moved = self.order != list(range(len(shape)))

    def _size(self, axes):
        return int(np.prod([self.shape[a] for a in axes], dtype=np.int64))

    def to_pool(self, x, shape=None):
        """x (of `shape`, default the layout's) as (batch, spatial..., channels)."""
        shape = self.shape if shape is None else list(shape)
        if self.moved:
            x = tf.transpose(x, self.order)
        return tf.reshape(x, [self._size(self.before)] + [shape[a] for a in self.windowed]
                          + [self._size(self.after)])

    def from_pool(self, pooled, spatial):
        out = tf.reshape(pooled, [self.shape[a] for a in self.before] + list(spatial)
                         + [self.shape[a] for a in self.after])
        return tf.transpose(out, np.argsort(self.order)) if self.moved else out


_FLOATS = {np.dtype(t) for t in ("float16", "float32", "float64")}
_HALVES = ("bfloat16",)


@rule("select_and_scatter_add")
def _select_and_scatter_add(ctx, g, x, y, *, op, window_dimensions, window_strides,
                            padding, window_dilation):
    g_aval, x_aval, y_aval = ctx.in_avals
    dtype = np.dtype(x_aval.dtype)
    if dtype not in _FLOATS and dtype.name not in _HALVES:
        raise EmitError(f"select_and_scatter_add of {dtype} has no TensorFlow kernel.")
    if any(d != 1 for d in window_dilation):
        raise EmitError("TensorFlow's max-pool gradients take no window dilation.")
    if None in x_aval.shape:
        raise EmitError("select_and_scatter_add needs static shapes to emit.")
    padding = resolve_padding(padding, x_aval.shape, window_dimensions, window_strides,
                              (1,) * len(x_aval.shape), window_dilation)
    if any(lo < 0 or hi < 0 for lo, hi in padding):
        raise EmitError("TensorFlow's max-pool gradients take no cropping (negative padding).")
    # Half floats compared and summed in float32: their values and the
    # comparisons are exact there; overlapping windows' sums are rounded
    # once (the NumPy kernel's float32 accumulation).
    work = tf.float32 if dtype.itemsize < 4 else tf_dtype(dtype)
    x, y, g = (t if t.dtype == work else tf.cast(t, work) for t in (x, y, g))
    if op == "min":  # the first minimum of x is the first maximum of -x
        x, y = -x, -y
    if any(lo or hi for lo, hi in padding):
        fill = identity("max", np.dtype(work.as_numpy_dtype))
        x = tf.pad(x, [list(p) for p in padding], constant_values=tf.constant(fill, work))
    shape = [n + lo + hi for n, (lo, hi) in zip(x_aval.shape, padding)]
    layout = PoolLayout(shape, window_dimensions, window_strides)
    windowed = layout.windowed
    if not windowed:  # every window one element: it takes its own cotangent
        grad = g
    else:
        if len(windowed) > 3:
            raise EmitError("TensorFlow's max-pool gradients window at most 3 axes.")
        if len(windowed) == 3 and ctx.mode == "graph" and not onednn_enabled():
            raise EmitError(
                "TensorFlow's MaxPool3DGrad without oneDNN (its Eigen kernel) gives a "
                "window's cotangent to every element equal to its maximum, not to the "
                "first one; the program runs on another engine.")
        xs, ys, gs = layout.to_pool(x), layout.to_pool(y, y_aval.shape), \
            layout.to_pool(g, y_aval.shape)
        ksize = [window_dimensions[a] for a in windowed]
        strides = [window_strides[a] for a in windowed]
        if len(windowed) == 1:  # a 2-d pool over a height of one
            xs, ys, gs = (tf.expand_dims(t, 1) for t in (xs, ys, gs))
            ksize, strides = [1] + ksize, [1] + strides
        kernel = tf.raw_ops.MaxPool3DGrad if len(ksize) == 3 else tf.raw_ops.MaxPoolGrad
        grad = kernel(orig_input=xs, orig_output=ys, grad=gs, ksize=[1, *ksize, 1],
                      strides=[1, *strides, 1], padding="VALID")
        if len(windowed) == 1:
            grad = tf.squeeze(grad, 1)
        grad = layout.from_pool(grad, [shape[a] for a in windowed])
    if any(lo or hi for lo, hi in padding):
        grad = grad[tuple(slice(lo, lo + n) for (lo, _), n in zip(padding, x_aval.shape))]
    out = tf_dtype(g_aval.dtype)
    return grad if grad.dtype == out else tf.cast(grad, out)
