"""TensorFlow rules of the control-flow primitives: their sub-graphs are
emitted inside tf.while_loop / tf.switch_case bodies (XLA's While and
Conditional); remat and custom_vjp run their forward graph inline (the
gradient is already part of the traced program)."""

import tensorflow as tf

from keras_ipu.device.to_tensorflow.emitter import graph_rule
from keras_ipu.device.to_tensorflow.emitter import rule
from keras_ipu.device.to_tensorflow.emitter import tf_dtype
from keras_ipu.device.to_tensorflow.emitter import unknown_dimension_error
from keras_ipu.device.to_tensorflow.emitter import xla_rule


@graph_rule("scan")
def _scan_graph(ctx, *operands, body, length, reverse, n_carry, n_xs, unroll):
    # TensorFlow's runtime copies a loop variable updated by
    # TensorScatterUpdate at every step (the loop holds it too), which is
    # quadratic in the trips (the LSTM's stacked outputs): its outputs go
    # to TensorArrays instead, written in place and stacked once.
    carry = list(operands[:n_carry])
    xs = operands[n_carry:n_carry + n_xs]
    consts = list(operands[n_carry + n_xs:])
    if length == 1:
        outs = ctx.emit(body, carry + [x[0] for x in xs] + consts)
        return tuple(outs[:n_carry]) + tuple(y[None] for y in outs[n_carry:])
    y_avals = ctx.out_avals[n_carry:]
    if length == 0:
        return tuple(carry) + tuple(tf.zeros(a.shape, a.dtype.name) for a in y_avals)
    return _scan_into_arrays(ctx, carry, xs, consts, body, length, reverse, n_carry, y_avals)


@xla_rule("scan")
def _scan(ctx, *operands, body, length, reverse, n_carry, n_xs, unroll):
    carry = list(operands[:n_carry])
    xs = operands[n_carry:n_carry + n_xs]
    consts = list(operands[n_carry + n_xs:])
    y_avals = ctx.out_avals[n_carry:]
    if length == 1:
        # One step (steps_per_execution=1): no loop, so XLA fuses and
        # updates the carried state as it would a plain step.
        outs = ctx.emit(body, carry + [x[0] for x in xs] + consts)
        return tuple(outs[:n_carry]) + tuple(y[None] for y in outs[n_carry:])
    if any(None in a.shape for a in y_avals):
        # Stacked outputs of a size known at run time only (a program
        # traced with an open batch size, for export).
        if length == 0:
            raise unknown_dimension_error("scan", y_avals[0].shape)
        return _scan_into_arrays(ctx, carry, xs, consts, body, length, reverse, n_carry, y_avals)
    ys = [tf.zeros(a.shape, a.dtype.name) for a in y_avals]
    if length == 0:
        return tuple(carry) + tuple(ys)

    def step(t, carry, ys):
        index = (length - 1 - t) if reverse else t
        x_t = [tf.gather(x, index) for x in xs]
        outs = ctx.emit(body, list(carry) + x_t + consts)
        new_carry = [tf.ensure_shape(tf.cast(o, c.dtype), c.shape)
                     for o, c in zip(outs[:n_carry], carry)]
        new_ys = [
            tf.tensor_scatter_nd_update(buf, [[index]], tf.cast(y, buf.dtype)[None])
            for buf, y in zip(ys, outs[n_carry:])
        ]
        return t + 1, new_carry, new_ys

    _, carry, ys = tf.while_loop(
        lambda t, c, y: t < length, step, (tf.constant(0), carry, ys),
        maximum_iterations=length,
    )
    return tuple(carry) + tuple(ys)


def stacked_array(x, length=None):
    """The TensorArray a graph-mode scan stacked into `x`, one of its
    stacked outputs emitted in the current graph (of `length` steps when
    given), or None."""
    arrays = getattr(tf.compat.v1.get_default_graph(), "_keras_ipu_stacked_arrays", {})
    found = arrays.get(x.ref())
    if found is None or length is not None and found[1] != length:
        return None
    return found[0]


def _hand_over(stacked, arrays, length):
    """Notes each stacked output's TensorArray for later readers in this
    graph (stacked_array): a later scan reads its steps from the array and
    a slice of one step reads that step, without the stack. The LSTM's
    backward loop read the forward loop's 8 residuals (32x128x128 each)
    from TensorListStack copies, one GatherV2 copy per residual per step."""
    graph = tf.compat.v1.get_default_graph()
    if not hasattr(graph, "_keras_ipu_stacked_arrays"):
        graph._keras_ipu_stacked_arrays = {}
    for t, a in zip(stacked, arrays):
        graph._keras_ipu_stacked_arrays[t.ref()] = (a, length)


def _scan_into_arrays(ctx, carry, xs, consts, body, length, reverse, n_carry, y_avals):
    arrays = [tf.TensorArray(tf_dtype(a.dtype), size=length,
                             element_shape=tf.TensorShape(a.shape[1:])) for a in y_avals]
    graph_mode = ctx.mode == "graph"
    readers = []
    for x in xs:
        array = stacked_array(x, length) if graph_mode else None
        readers.append((lambda i, x=x: tf.gather(x, i)) if array is None
                       else (lambda i, a=array: a.read(i)))

    def step(t, carry, arrays):
        index = (length - 1 - t) if reverse else t
        outs = ctx.emit(body, list(carry) + [read(index) for read in readers] + consts)
        new_carry = [tf.ensure_shape(tf.cast(o, c.dtype), c.shape)
                     for o, c in zip(outs[:n_carry], carry)]
        arrays = [a.write(index, tf.cast(y, a.dtype)) for a, y in zip(arrays, outs[n_carry:])]
        return t + 1, new_carry, arrays

    _, carry, arrays = tf.while_loop(
        lambda t, c, a: t < length, step, (tf.constant(0), carry, arrays),
        maximum_iterations=length,
    )
    stacked = [a.stack() for a in arrays]
    if graph_mode:
        _hand_over(stacked, arrays, length)
    return tuple(carry) + tuple(stacked)


@rule("while_loop")
def _while(ctx, *operands, cond_graph, body_graph, n_cond_consts):
    n_carry = len(cond_graph.inputs) - n_cond_consts
    carry = list(operands[:n_carry])
    cond_consts = list(operands[n_carry:n_carry + n_cond_consts])
    body_consts = list(operands[n_carry + n_cond_consts:])

    def cond(*c):
        (pred,) = ctx.emit(cond_graph, list(c) + cond_consts)
        return tf.reshape(pred, ())

    def body(*c):
        outs = ctx.emit(body_graph, list(c) + body_consts)
        return [tf.cast(o, v.dtype) for o, v in zip(outs, c)]

    return tuple(tf.while_loop(cond, body, carry))


@rule("cond")
def _cond(ctx, index, *operands, branches):
    last = len(branches) - 1
    index = tf.clip_by_value(tf.cast(index, tf.int32), 0, last)
    fns = [
        (lambda g=g: ctx.emit(g, list(operands)))
        for g in branches
    ]
    if len(fns) == 1:
        return tuple(fns[0]())
    return tuple(tf.switch_case(index, fns))


@rule("remat")
def _remat(ctx, *operands, graph):
    return tuple(ctx.emit(graph, list(operands)))


@rule("custom_vjp")
def _custom_vjp(ctx, *operands, fwd, bwd, n_outputs, n_args, bwd_nonzero):
    return tuple(ctx.emit(fwd, list(operands)))
