"""XLA-mode rules of dot_general, conv_general_dilated and reduce_window:
XLA's own DotGeneral, Conv and ReduceWindow (their params are XLA's); and
of reduce_sum, large sums over leading or trailing axes as a DotGeneral.
graph_contraction_rules.py has the graph mode's."""

import functools

import numpy as np
import tensorflow as tf
from tensorflow.compiler.tf2xla.python import xla as tfxla
from tensorflow.compiler.xla import xla_data_pb2

from keras_ipu.device.primitives.conv import resolve_padding
from keras_ipu.device.primitives.pooling import identity
from keras_ipu.device.to_tensorflow.array_rules import product_sum_rule
from keras_ipu.device.to_tensorflow.emitter import tf_dtype
from keras_ipu.device.to_tensorflow.emitter import xla_rule


def _merged_contraction(lhs, rhs, lhs_shape, rhs_shape, lc, rc):
    """(lhs, rhs, lc, rc) with the contracting axes merged into one where
    each operand's are adjacent and in the same order (a reshape, no data
    moved), else as given. XLA's CPU backend takes a product over one axis
    in any position as it is, but puts an operand's several contracting
    axes last with a transposing copy: the LSTM's weight gradients over
    (time, batch) (the embedding's 64 features: 0.6 ms of the 18.8 ms
    one-thread step for the copy, more than its product lost reading the
    operand transposed)."""
    if len(lc) < 2:
        return lhs, rhs, lc, rc

    def run(axes):
        return list(axes) == list(range(axes[0], axes[0] + len(axes)))

    if not (run(lc) and run(rc)) or None in lhs_shape or None in rhs_shape:
        return lhs, rhs, lc, rc

    def merged(x, shape, axes):
        lo, hi = axes[0], axes[-1] + 1
        return tf.reshape(x, tuple(shape[:lo]) + (int(np.prod(shape[lo:hi])),) + tuple(shape[hi:]))

    return (merged(lhs, lhs_shape, lc), merged(rhs, rhs_shape, rc), (lc[0],), (rc[0],))


@xla_rule("dot_general")
def _dot_general(ctx, lhs, rhs, *, dimension_numbers, preferred_element_type=None):
    (lc, rc), (lb, rb) = dimension_numbers
    if not lb:
        lhs, rhs, lc, rc = _merged_contraction(
            lhs, rhs, ctx.in_avals[0].shape, ctx.in_avals[1].shape, lc, rc)
    dims = xla_data_pb2.DotDimensionNumbers()
    dims.lhs_contracting_dimensions.extend(lc)
    dims.rhs_contracting_dimensions.extend(rc)
    dims.lhs_batch_dimensions.extend(lb)
    dims.rhs_batch_dimensions.extend(rb)
    out_dtype = tf_dtype(ctx.out_aval.dtype)
    if lhs.dtype == tf.bool:
        lhs, rhs = tf.cast(lhs, tf.int32), tf.cast(rhs, tf.int32)
        out = tfxla.dot_general(lhs, rhs, dims, None, preferred_element_type=tf.int32, use_v2=True)
        return tf.not_equal(out, 0) if out_dtype == tf.bool else tf.cast(out, out_dtype)
    out = tfxla.dot_general(lhs, rhs, dims, None, preferred_element_type=out_dtype,
                            use_v2=True)
    return out


def canonical_conv(ctx, lhs, rhs, padding, window_strides, lhs_dilation, rhs_dilation,
                   dimension_numbers):
    """(lhs, rhs, padding, restore): the operands transposed to the
    canonical layout, batch-spatial-feature input and spatial-in-out
    kernel (the one output layout both XLA's and TensorFlow's fast CPU
    kernels take; gradients come in others: a weight gradient's batch is
    the input's feature), the padding resolved, and `restore(out)`, the
    canonical batch-spatial-feature result put in the primitive's layout."""
    lhs_spec, rhs_spec, out_spec = dimension_numbers
    lhs_aval, rhs_aval = ctx.in_avals
    in_sizes = [lhs_aval.shape[a] for a in lhs_spec[2:]]
    window = [rhs_aval.shape[a] for a in rhs_spec[2:]]
    padding = resolve_padding(padding, in_sizes, window, window_strides,
                              lhs_dilation, rhs_dilation)
    lhs = tf.transpose(lhs, (lhs_spec[0],) + tuple(lhs_spec[2:]) + (lhs_spec[1],))
    rhs = tf.transpose(rhs, tuple(rhs_spec[2:]) + (rhs_spec[1], rhs_spec[0]))
    # Axis k of the canonical result is out_spec's role k (batch, spatial
    # dims, feature): put each role where out_spec wants it.
    roles = (out_spec[0],) + tuple(out_spec[2:]) + (out_spec[1],)
    inverse = [0] * len(roles)
    for k, axis in enumerate(roles):
        inverse[axis] = k

    def restore(out):
        return tf.transpose(out, inverse)

    return lhs, rhs, padding, restore


@xla_rule("conv_general_dilated")
def _conv(ctx, lhs, rhs, *, window_strides, padding, lhs_dilation, rhs_dilation,
          dimension_numbers, feature_group_count):
    # XLA's CPU backend runs a convolution through its fast (Eigen)
    # kernels only in the canonical layout; in others it would run a naive
    # loop. Transposes to and from the canonical layout make every
    # convolution the fast kind.
    lhs, rhs, padding, restore = canonical_conv(
        ctx, lhs, rhs, padding, window_strides, lhs_dilation, rhs_dilation,
        dimension_numbers)
    nsp = len(window_strides)
    spatial = list(range(1, nsp + 1))
    dims = xla_data_pb2.ConvolutionDimensionNumbers()
    dims.input_batch_dimension = 0
    dims.input_feature_dimension = nsp + 1
    dims.input_spatial_dimensions.extend(spatial)
    dims.kernel_spatial_dimensions.extend(range(nsp))
    dims.kernel_input_feature_dimension = nsp
    dims.kernel_output_feature_dimension = nsp + 1
    dims.output_batch_dimension = 0
    dims.output_feature_dimension = nsp + 1
    dims.output_spatial_dimensions.extend(spatial)
    out = tfxla.conv(
        lhs, rhs,
        window_strides=list(window_strides),
        padding=[list(p) for p in padding],
        lhs_dilation=list(lhs_dilation),
        rhs_dilation=list(rhs_dilation),
        dimension_numbers=dims,
        feature_group_count=feature_group_count,
        precision_config=None,
        preferred_element_type=tf_dtype(ctx.out_aval.dtype),
        use_v2=True,
    )
    return restore(out)


_REDUCERS = {"sum": tf.math.add, "max": tf.math.maximum, "min": tf.math.minimum}


@xla_rule("reduce_window")
def _reduce_window(ctx, x, *, op, window_dimensions, window_strides, padding,
                   base_dilation, window_dilation):
    aval = ctx.in_avals[0]
    padding = resolve_padding(padding, aval.shape, window_dimensions,
                              window_strides, base_dilation, window_dilation)
    dtype = x.dtype
    init = tf.constant(np.asarray(identity(op, aval.dtype), aval.dtype))
    combine = _REDUCERS[op]
    spec = tf.TensorSpec((), dtype)

    def reducer(a, b):
        return combine(a, b)

    reducer = tf.function(reducer, autograph=False).get_concrete_function(spec, spec)
    return tfxla.reduce_window(
        x, init, reducer,
        window_dimensions=list(window_dimensions),
        window_strides=list(window_strides),
        base_dilations=list(base_dilation),
        window_dilations=list(window_dilation),
        padding=[list(p) for p in padding],
    )


# XLA's CPU compiler (TensorFlow 2.21) gives a sum of at least 32K elements
# to YNNPACK only where its operand is not a product, broadcast, reshape,
# slice, concatenate or convert (xla/backends/cpu/ynn_support.cc). It
# splits any other sum over axes of 32 or more into a reduce-window of 32
# and a reduce (TreeReductionRewriter), a loop that took about 1 ns per
# element here: the transformer's bias gradients over 8192 rows (its
# feed-forward one alone 0.8 ms of a 26 ms one-thread step) and its
# LayerNormalization and softmax row sums of products. A sum over the
# leading or the trailing axes is emitted instead as a product with a
# vector of ones, over the operand seen as (rows, columns): the
# transformer's executable took 30.3 -> 27.1 CPU ms per step at one
# thread, 30.7 -> 26.2 at two (issue 16, twentieth pass). The additions
# run in another order (the product's, down each column as NumPy's sum
# over leading axes does): the values agree within float rounding.
SUM_AS_PRODUCT_MIN_ELEMENTS = 1 << 15


def _sum_as_product(x, rows, cols, side):
    matrix = tf.reshape(x, (rows, cols))
    ones = tf.ones(((rows, cols)[side],), x.dtype)
    dims = xla_data_pb2.DotDimensionNumbers()
    dims.lhs_contracting_dimensions.extend([side])
    dims.rhs_contracting_dimensions.extend([0])
    lhs, rhs = (ones, matrix) if side == 0 else (matrix, ones)
    return tfxla.dot_general(lhs, rhs, dims, None, preferred_element_type=x.dtype, use_v2=True)


xla_rule("reduce_sum")(product_sum_rule(
    SUM_AS_PRODUCT_MIN_ELEMENTS, leading=functools.partial(_sum_as_product, side=0),
    trailing=functools.partial(_sum_as_product, side=1)))
