"""PopnnLSTM and PopnnGRU: Graphcore's IPU recurrent layers.

They compute what Keras' LSTM and GRU compute with the same weights (the
kernels, recurrent kernels and biases load into each other with
set_weights), with PopLibs' restrictions: no masks, regularizers,
constraints, recurrent dropout, go_backwards or unroll; a bias always; a
few activations; one dropout mask shared by all time steps of a sequence.
On the device the sequence is one loop (a scan), as PopLibs runs it.
"""

import keras
import numpy as np
from keras import ops
from keras.src import backend
from keras.src.utils import tracking

from keras_ipu.layers._base import check_unsupported
from keras_ipu.layers._base import serializable
from keras_ipu.layers.dropout import _seed_key

ACCEPTED_ACTIVATIONS = ["tanh", "relu", "softmax", "sigmoid", "hard_sigmoid"]
ACCEPTED_RECURRENT_ACTIVATIONS = ["tanh", "softmax", "sigmoid", "hard_sigmoid"]


def _quoted(names):
    return ",".join(f'"{n}"' for n in names)


def activation_name(identifier):
    """The name of an activation given by name or as a Keras activation
    function (Graphcore's op_util.get_activation_name)."""
    if isinstance(identifier, str):
        return identifier
    if callable(identifier):
        module = getattr(identifier, "__module__", "") or ""
        if not module.startswith(("keras.", "keras_ipu.")):
            raise TypeError(
                f"Unrecognized function : {module}.{identifier.__name__}")
        return identifier.__name__
    raise TypeError(
        f"Could not interpret activation function identifier: {identifier!r}")


class _PopnnRNN(keras.layers.Layer):
    """What PopnnLSTM and PopnnGRU share: arguments, checks, weights, the
    time loop, dropout and state.

    Arguments: Keras' LSTM/GRU arguments (units, activation,
    recurrent_activation, use_bias, the initializers, dropout,
    return_sequences, return_state, stateful, ...; those PopLibs lacks
    raise ValueError), and Graphcore's: dropout_seed (a seed pair),
    partials_dtype, seed, time_major (inputs [time, batch, features]),
    options and options_bwd (PopLibs planning options).
    """

    _kind = None  # "LSTM" or "GRU"
    _gates = None

    def __init__(self, units, activation="tanh", recurrent_activation="sigmoid",
                 use_bias=True, kernel_initializer="glorot_uniform",
                 recurrent_initializer="orthogonal", bias_initializer="zeros", *,
                 kernel_regularizer=None, recurrent_regularizer=None,
                 bias_regularizer=None, activity_regularizer=None,
                 kernel_constraint=None, recurrent_constraint=None,
                 bias_constraint=None, dropout=0.0, dropout_seed=None,
                 recurrent_dropout=0.0, implementation=2, return_sequences=False,
                 return_state=False, go_backwards=False, stateful=False,
                 unroll=False, partials_dtype="float32", seed=None,
                 time_major=False, options=None, options_bwd=None, **kwargs):
        kind = self._kind
        if implementation == 2:  # Keras' default; PopLibs has one
            implementation = 1
        if not use_bias:
            raise ValueError(
                f"IPU custom {kind} layer does not support use_bias = False.")
        refused = {
            "kernel_regularizer": kernel_regularizer,
            "recurrent_regularizer": recurrent_regularizer,
            "bias_regularizer": bias_regularizer,
            "activity_regularizer": activity_regularizer,
            "kernel_constraint": kernel_constraint,
            "recurrent_constraint": recurrent_constraint,
            "bias_constraint": bias_constraint,
        }
        for name, value in refused.items():
            if value:
                raise ValueError(
                    f"IPU custom {kind} layer does not support {name}.")
        if recurrent_dropout != 0.0:
            what = ("recurrent_dropout." if kind == "LSTM"
                    else "recurrent_dropout != 0.")
            raise ValueError(f"IPU custom {kind} layer does not support {what}")
        if implementation != 1:
            raise ValueError(
                f"IPU custom {kind} layer does not support implementation != 1.")
        if go_backwards:
            what = "go_backwards = True." if kind == "LSTM" else "go_backwards."
            raise ValueError(f"IPU custom {kind} layer does not support {what}")
        if unroll:
            what = "unroll = True." if kind == "LSTM" else "unroll."
            raise ValueError(f"IPU custom {kind} layer does not support {what}")
        super().__init__(**kwargs)
        activation = activation_name(activation)
        recurrent_activation = activation_name(recurrent_activation)
        if activation not in ACCEPTED_ACTIVATIONS:
            raise ValueError(
                f"IPU custom RNN layer does not support '{activation}' as an "
                f"activation. Acceptable value are "
                f"{_quoted(ACCEPTED_ACTIVATIONS)}")
        if recurrent_activation not in ACCEPTED_RECURRENT_ACTIVATIONS:
            raise ValueError(
                f"IPU custom RNN layer does not support '{recurrent_activation}' "
                f"as a recurrent activation. Acceptable value are "
                f"{_quoted(ACCEPTED_RECURRENT_ACTIVATIONS)}")
        dtype = self.dtype_policy.variable_dtype
        if dtype not in ("float16", "float32"):
            raise ValueError(f"Only support float16, float32, provided {dtype}")
        self.units = units
        self.activation = activation
        self.recurrent_activation = recurrent_activation
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.recurrent_initializer = keras.initializers.get(recurrent_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.dropout = dropout
        self.dropout_seed = (None if dropout_seed is None
                             else [int(s) for s in np.asarray(dropout_seed).ravel()])
        self._dropout_key = None if dropout_seed is None else _seed_key(dropout_seed)
        if dropout > 0 and dropout_seed is None:
            self.seed_generator = backend.random.SeedGenerator()
        self.return_sequences = return_sequences
        self.return_state = return_state
        self.stateful = stateful
        # PopLibs computes partial sums in this type; on the host float32.
        self.partials_dtype = keras.backend.standardize_dtype(partials_dtype)
        self.seed = seed
        self.time_major = time_major
        # PopLibs planning options: they change how the IPU runs the layer,
        # not its values; kept for the config.
        self.options = dict(options or {})
        self.options_bwd = dict(options_bwd or {})

    # -- weights -----------------------------------------------------------
    def build(self, input_shape):
        if len(input_shape) != 3:
            raise ValueError(
                f"Expecting input_shape with 3 dims, got {len(input_shape)}")
        if input_shape[-1] is None:
            raise ValueError(
                "The last dimension of the inputs to `_PopnnRNN` should be "
                "defined. Found `None`.")
        width = self._gates * self.units
        self.kernel = self.add_weight(
            shape=(input_shape[-1], width), initializer=self.kernel_initializer,
            name="kernel")
        self.recurrent_kernel = self.add_weight(
            shape=(self.units, width), initializer=self.recurrent_initializer,
            name="recurrent_kernel")
        self.biases = self.add_weight(
            shape=self._bias_shape(), initializer=self._bias_init(), name="biases")
        if self.stateful:
            batch = input_shape[1 if self.time_major else 0]
            if batch is None:
                raise ValueError(
                    f"A stateful {type(self).__name__} needs a known batch size "
                    "(keras.Input(batch_size=...)) to create its state.")
            self._create_states(batch)

    @tracking.no_automatic_dependency_tracking
    def _create_states(self, batch):
        # As Keras' RNN: state variables, not weights (set_weights and the
        # saved weights are the same as a stateless layer's).
        with backend.name_scope(self.name, caller=self):
            self.states = [
                backend.Variable(np.zeros((batch, self.units)), trainable=False,
                                 dtype=self.variable_dtype, name="rnn_state")
                for _ in range(self._n_states)
            ]

    def _bias_shape(self):
        return (self._gates * self.units,)

    def _bias_init(self):
        return self.bias_initializer

    # -- the computation ---------------------------------------------------
    def _act(self, name):
        return keras.activations.get(name)

    def call(self, inputs, mask=None, training=None, initial_state=None):
        check_unsupported(self, mask is not None, "mask", "call")
        if len(inputs.shape) != 3:
            raise ValueError("inputs tensor must be 3D")
        # PopLibs has no dynamic training flag: unless told False, training.
        training = training if isinstance(training, bool) else True
        x = ops.cast(inputs, self.compute_dtype)
        if not self.time_major:
            x = ops.transpose(x, (1, 0, 2))  # PopLibs' [time, batch, features]
        if self.dropout > 0.0 and training:
            seed = (self._dropout_key if self._dropout_key is not None
                    else self.seed_generator)
            # One mask for all time steps of a sequence.
            x = backend.random.dropout(
                x, self.dropout, noise_shape=(1,) + tuple(x.shape[1:]), seed=seed)
        if initial_state is not None:
            states = list(initial_state) if isinstance(
                initial_state, (list, tuple)) else [initial_state]
        elif self.stateful:
            states = [s.value for s in self.states]
        else:
            # [batch, units] zeros, whether or not the batch size is known.
            zero = ops.zeros_like(x[0, :, :1]) * ops.zeros((1, self.units), x.dtype)
            states = [zero] * self._n_states
        states = [ops.cast(s, self.compute_dtype) for s in states]
        last, outputs, final = backend.rnn(
            self._step, x, states, time_major=True,
            return_all_outputs=self.return_sequences)
        if self.stateful:
            for variable, value in zip(self.states, final):
                variable.assign(ops.cast(value, variable.dtype))
        output = last
        if self.return_sequences:
            output = outputs if self.time_major else ops.transpose(outputs, (1, 0, 2))
        if self.return_state:
            return (output, *final)
        return output

    def compute_output_shape(self, input_shape):
        batch = input_shape[1 if self.time_major else 0]
        if self.return_sequences:
            out = tuple(input_shape[:2]) + (self.units,)
        else:
            out = (batch, self.units)
        if self.return_state:
            return (out,) + ((batch, self.units),) * self._n_states
        return out

    def reset_states(self):
        for state in getattr(self, "states", ()) or ():
            state.assign(ops.zeros(state.shape, state.dtype))

    def get_config(self):
        return {
            **super().get_config(),
            "units": self.units,
            "activation": self.activation,
            "recurrent_activation": self.recurrent_activation,
            "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
            "recurrent_initializer":
                keras.initializers.serialize(self.recurrent_initializer),
            "bias_initializer": keras.initializers.serialize(self.bias_initializer),
            "dropout": self.dropout,
            "dropout_seed": self.dropout_seed,
            "return_sequences": self.return_sequences,
            "return_state": self.return_state,
            "stateful": self.stateful,
            "partials_dtype": self.partials_dtype,
            "seed": self.seed,
            "time_major": self.time_major,
            "options": self.options,
            "options_bwd": self.options_bwd,
        }


@serializable
class PopnnLSTM(_PopnnRNN):
    """Long Short-Term Memory layer (Hochreiter and Schmidhuber 1997) as
    PopLibs runs it. Gates i, f, c, o in Keras' order; the default
    recurrent activation is sigmoid. `initial_state` is (h, c);
    `return_state` adds the final h and c. `unit_forget_bias` adds 1 to the
    forget gate's bias at initialization. Unsupported (ValueError):
    use_bias=False, regularizers, constraints, recurrent_dropout,
    implementation other than 1 or 2, go_backwards, unroll."""

    _kind = "LSTM"
    _gates = 4
    _n_states = 2

    def __init__(self, units, *args, unit_forget_bias=True, **kwargs):
        super().__init__(units, *args, **kwargs)
        self.unit_forget_bias = unit_forget_bias

    def _bias_init(self):
        if not self.unit_forget_bias:
            return self.bias_initializer
        units, init = self.units, self.bias_initializer

        def bias_with_forget_one(shape, dtype=None):
            return ops.concatenate([
                init((units,), dtype=dtype),
                ops.ones((units,), dtype=dtype),
                init((2 * units,), dtype=dtype),
            ])

        return bias_with_forget_one

    def _step(self, x_t, states):
        h, c = states
        act = self._act(self.activation)
        rec = self._act(self.recurrent_activation)
        z = ops.matmul(x_t, self.kernel)
        z = ops.add(z, ops.matmul(h, self.recurrent_kernel))
        z = ops.add(z, self.biases)
        z_i, z_f, z_c, z_o = ops.split(z, 4, axis=1)
        c = rec(z_f) * c + rec(z_i) * act(z_c)
        h = rec(z_o) * act(c)
        return h, [h, c]

    def get_config(self):
        return {**super().get_config(), "unit_forget_bias": self.unit_forget_bias}


@serializable
class PopnnGRU(_PopnnRNN):
    """Gated Recurrent Unit (Cho et al. 2014) as PopLibs runs it. Gates z, r,
    h in Keras' order; the default recurrent activation is sigmoid.
    `reset_after=True` (the default, Keras' convention) applies the reset
    gate after the recurrent matrix product, with separate input and
    recurrent biases ([2, 3 * units]); False applies it before (one bias).
    Unsupported arguments as PopnnLSTM's."""

    _kind = "GRU"
    _gates = 3
    _n_states = 1

    def __init__(self, units, *args, reset_after=True, **kwargs):
        self.reset_after = reset_after
        super().__init__(units, *args, **kwargs)

    def _bias_shape(self):
        if self.reset_after:
            return (2, self._gates * self.units)
        return (self._gates * self.units,)

    def _step(self, x_t, states):
        (h,) = states
        u = self.units
        act = self._act(self.activation)
        rec = self._act(self.recurrent_activation)
        if self.reset_after:
            input_bias, recurrent_bias = self.biases[0], self.biases[1]
        else:
            input_bias, recurrent_bias = self.biases, None
        x = ops.add(ops.matmul(x_t, self.kernel), input_bias)
        x_z, x_r, x_h = ops.split(x, 3, axis=-1)
        if self.reset_after:
            inner = ops.matmul(h, self.recurrent_kernel) + recurrent_bias
        else:
            inner = ops.matmul(h, self.recurrent_kernel[:, : 2 * u])
        z = rec(x_z + inner[:, :u])
        r = rec(x_r + inner[:, u:2 * u])
        if self.reset_after:
            recurrent_h = r * inner[:, 2 * u:]
        else:
            recurrent_h = ops.matmul(r * h, self.recurrent_kernel[:, 2 * u:])
        hh = act(x_h + recurrent_h)
        h = z * h + (1 - z) * hh
        return h, [h]

    def get_config(self):
        return {**super().get_config(), "reset_after": self.reset_after}


LSTM = PopnnLSTM
GRU = PopnnGRU
