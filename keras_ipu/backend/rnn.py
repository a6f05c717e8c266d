"""Recurrent ops for the ipu backend.

`rnn` runs a Keras step function over the time axis with the backend's
`scan` (one scan primitive when traced, a Python loop eagerly), or fully
unrolled when `unroll=True`. There is no fused (cuDNN-like) LSTM/GRU kernel:
`lstm`/`gru` raise NotImplementedError, which tells the Keras layers to use
their generic cell-by-cell path built on `rnn`.
"""

from keras.src import tree
from keras.src.backend.common import stateless_scope

from keras_ipu.backend.control_flow import scan
from keras_ipu.backend.core import cast


def _knp():
    from keras_ipu.backend import numpy as knp

    return knp


def _swap_batch_time(x):
    axes = list(range(x.ndim))
    axes[0], axes[1] = 1, 0
    return _knp().transpose(x, axes)


def _expand_mask_like(mask_t, x):
    """mask_t (batch, 1) as a bool array broadcastable against x."""
    knp = _knp()
    for _ in range(x.ndim - mask_t.ndim):
        mask_t = knp.expand_dims(mask_t, -1)
    return mask_t


def _select(mask_t, new, old):
    return _knp().where(_expand_mask_like(mask_t, new), new, old)


def rnn(
    step_function,
    inputs,
    initial_states,
    go_backwards=False,
    mask=None,
    constants=None,
    unroll=False,
    input_length=None,
    time_major=False,
    zero_output_for_mask=False,
    return_all_outputs=True,
):
    knp = _knp()
    if not time_major:
        inputs = tree.map_structure(_swap_batch_time, inputs)
    flat_inputs = tree.flatten(inputs)
    time_steps = flat_inputs[0].shape[0]

    if mask is not None:
        if str(mask.dtype) != "bool":
            mask = cast(mask, "bool")
        if mask.ndim == 2:
            mask = knp.expand_dims(mask, -1)
        if not time_major:
            mask = _swap_batch_time(mask)
    constants = list(constants) if constants else []

    if unroll:
        if not time_steps:
            raise ValueError(
                "Unrolling an RNN needs a fixed number of timesteps; the time "
                "axis of the inputs has unknown size. Pass unroll=False or "
                "give the inputs a static sequence length."
            )
        return _unrolled(
            step_function, inputs, initial_states, go_backwards, mask,
            constants, time_steps, time_major, return_all_outputs,
        )

    if mask is not None:

        def step(states, x_and_mask):
            x_t, mask_t = x_and_mask
            # A sample is skipped at step t when all its mask entries are off.
            keep = knp.any(mask_t, axis=-1, keepdims=True)
            output_t, new_states = step_function(
                x_t, tuple(states) + tuple(constants)
            )
            if zero_output_for_mask:
                previous = knp.zeros_like(output_t)
            else:
                # Keras carries the previous output as the first state (the
                # last cell's first state for stacked cells).
                previous = states[0]
                if tree.is_nested(previous):
                    previous = states[-1][0]
            output_t = _select(keep, output_t, previous)
            new_states = tree.map_structure(
                lambda new, old: _select(keep, new, old), new_states, states
            )
            return new_states, output_t

        xs = (inputs, mask)
    else:

        def step(states, x_t):
            output_t, new_states = step_function(
                x_t, tuple(states) + tuple(constants)
            )
            return new_states, output_t

        xs = inputs

    # Variable updates inside the step are not allowed to leak out of the
    # loop (it may be traced): reuse the caller's stateless scope or open one.
    if stateless_scope.in_stateless_scope():
        new_states, outputs = scan(step, initial_states, xs,
                                   reverse=go_backwards)
    else:
        with stateless_scope.StatelessScope():
            new_states, outputs = scan(step, initial_states, xs,
                                       reverse=go_backwards)
    if go_backwards:
        outputs = tree.map_structure(lambda y: knp.flip(y, axis=0), outputs)
    last_output = tree.map_structure(lambda y: y[-1], outputs)
    if not time_major:
        outputs = tree.map_structure(_swap_batch_time, outputs)
    return last_output, outputs, new_states


def _unrolled(
    step_function, inputs, initial_states, go_backwards, mask, constants,
    time_steps, time_major, return_all_outputs,
):
    knp = _knp()
    order = range(time_steps - 1, -1, -1) if go_backwards else range(time_steps)
    states = tuple(initial_states)
    outputs = []
    output = None
    for t in order:
        x_t = tree.map_structure(lambda x: x[t], inputs)
        output_t, new_states = step_function(x_t, states + tuple(constants))
        if mask is not None:
            keep = knp.any(mask[t], axis=-1, keepdims=True)
            if output is None:
                previous = knp.zeros_like(output_t)
            else:
                previous = output
            output_t = _select(keep, output_t, previous)
            flat_new = [
                _select(keep, n, o)
                for n, o in zip(tree.flatten(new_states), tree.flatten(states))
            ]
            new_states = tree.pack_sequence_as(states, flat_new)
        states = tuple(new_states) if isinstance(
            new_states, (list, tuple)) else (new_states,)
        output = output_t
        if return_all_outputs or not outputs:
            outputs.append(output_t)
        else:
            outputs[0] = output_t
    stacked = knp.stack(outputs)
    if not time_major:
        stacked = _swap_batch_time(stacked)
    return output, stacked, new_states


def lstm(*args, **kwargs):
    raise NotImplementedError


def gru(*args, **kwargs):
    raise NotImplementedError


def bidirectional_lstm(*args, **kwargs):
    raise NotImplementedError


def bidirectional_gru(*args, **kwargs):
    raise NotImplementedError


def cudnn_ok(*args, **kwargs):
    return False
