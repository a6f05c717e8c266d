"""Graphcore's host embedding (embedding_ops.HostEmbedding,
create_host_embedding and the optimizer specs): an embedding table kept in
host memory, whose lookups and SGD updates the IPU streams from and to the
host while the program runs.

The table is a CPU tf.Variable (get_embedding_tensor). While the embedding
is registered (`with embedding.register(session):`, the session being
optional in TensorFlow 2) the host holds it as an array and serves the
program's requests over a host data stream (device/host_streams.py), as
Poplar's host embedding callbacks do:
- a lookup is an XLA custom call the front end imports as a send of the
  indices to the host and a receive of their rows (host_transfer's
  stream_to_host and stream_from_host: each costed as the PCIe transfer of
  its bytes, so the streaming is in the program's prediction);
- with an optimizer spec, the lookup's gradient is a custom call that
  sends the indices and the rows' gradients to the host, which applies SGD
  (every update at once: table[i] -= learning_rate x gradient, repeated
  indices adding up; with HostEmbeddingSGDGAOptimizerSpec the gradients
  are summed over accumulation_factor updates and applied on the last).
  As in Graphcore's, the gradient reaches the host through a scalar
  trainable variable the lookup reads (its gradient is zero): the update
  runs when the optimizer differentiates the loss with respect to the
  trainable variables.
Leaving the context writes the host table back to the variable. Replicas
share the one host table (each replica's lookups and updates, in the order
they reach the host).
"""

import threading

import numpy as np

from keras_ipu.ops import xla_custom_call

LOOKUP = "KerasIpuHostEmbeddingLookup"
UPDATE = "KerasIpuHostEmbeddingUpdate"
# Stream components: indices of a lookup, indices and gradients of an update.
_LOOKUP_INDICES, _UPDATE_INDICES, _UPDATE_GRADIENTS = 0, 1, 2


class HostTable:
    """The host side of one embedding's stream (see the module doc)."""

    def __init__(self, name, learning_rate=None, accumulation_factor=1):
        self.name = name
        self.learning_rate = learning_rate
        self.accumulation_factor = accumulation_factor
        self.table = None
        self._pending = {}
        self._accumulated = []
        self._lock = threading.Lock()

    def load(self, value):
        with self._lock:
            if self.table is not None:
                raise RuntimeError(f"HostEmbedding {self.name!r} is already registered.")
            self.table = np.array(value, copy=True)
            self._accumulated = []

    def unload(self):
        with self._lock:
            value, self.table = self.table, None
        return value

    def _registered(self):
        if self.table is None:
            raise RuntimeError(
                f"HostEmbedding {self.name!r} is not registered: run the program that "
                "looks it up inside `with embedding.register(session):`.")
        return self.table

    def send(self, component, value):
        with self._lock:
            self._registered()
            key = (threading.get_ident(), component)
            if component != _UPDATE_GRADIENTS:
                self._pending[key] = np.asarray(value, np.int64)
                return
            indices = self._pending.pop((threading.get_ident(), _UPDATE_INDICES))
            self._accumulated.append((indices, np.asarray(value)))
            if len(self._accumulated) == self.accumulation_factor:
                for idx, grads in self._accumulated:
                    np.subtract.at(self.table, idx,
                                   (self.learning_rate * grads).astype(self.table.dtype))
                self._accumulated = []

    def receive(self, component, shape, dtype):
        with self._lock:
            table = self._registered()
            indices = self._pending.pop((threading.get_ident(), _LOOKUP_INDICES))
            return table[indices].astype(dtype).reshape(shape)


@xla_custom_call.import_rule(LOOKUP)
def _import_lookup(imp, instr, operands, config):
    from keras_ipu.device.primitives import host_transfer
    from keras_ipu.frontends.tensorflow.opcodes.effects import bind_effect

    (indices,) = operands
    bind_effect(imp, host_transfer.stream_to_host_p, imp.array(indices), stream=config["stream"],
            component=_LOOKUP_INDICES)
    (rows,) = bind_effect(imp, host_transfer.stream_from_host_p, stream=config["stream"],
                      component=_LOOKUP_INDICES, shape=tuple(config["shape"]),
                      dtype=np.dtype(config["dtype"]))
    return rows


@xla_custom_call.import_rule(UPDATE)
def _import_update(imp, instr, operands, config):
    from keras_ipu.device.primitives import host_transfer
    from keras_ipu.frontends.tensorflow.opcodes.effects import bind_effect

    indices, grads = operands
    bind_effect(imp, host_transfer.stream_to_host_p, imp.array(indices), stream=config["stream"],
            component=_UPDATE_INDICES)
    bind_effect(imp, host_transfer.stream_to_host_p, imp.array(grads), stream=config["stream"],
            component=_UPDATE_GRADIENTS)
    return np.zeros((), np.dtype(config["dtype"]))


# name -> (HostTable, its stream id, the anchor variable or None): the
# embedding's name identifies it, as in Graphcore's.
_tables = {}
_tables_lock = threading.Lock()


def create_table(name, dtype, learning_rate, accumulation_factor):
    """The host side of embedding `name` (a new one replaces an older one of
    the name); with a learning rate, also the scalar trainable variable
    through which its lookups' gradients reach the host."""
    import tensorflow as tf

    from keras_ipu.device import host_streams

    table = HostTable(name, learning_rate, accumulation_factor)
    anchor = None
    if learning_rate is not None:
        with tf.init_scope():
            anchor = tf.Variable(tf.zeros((), dtype), trainable=True, name=f"{name}/__dummy")
    with _tables_lock:
        _tables[name] = (table, host_streams.register(table), anchor)


def _entry(name):
    entry = _tables.get(name)
    if entry is None:
        raise ValueError(f"No HostEmbedding named {name!r} exists: make it with "
                         "embedding_ops.create_host_embedding.")
    return entry


def anchor(name):
    return _entry(name)[2]


def streamed_lookup(name, indices, encoding, dtype, trainable=False):
    """The rows of `indices` (flat int32) of embedding `name`, served by the
    host; when `trainable`, their gradient is sent back to the host as an
    update (through the embedding's anchor variable, which joins the TF1
    trainable variables of the graph being traced)."""
    import tensorflow as tf

    _, stream, anchor_variable = _entry(name)
    n = indices.shape[0]
    config = {"stream": stream, "shape": [n, encoding], "dtype": dtype.name}

    def lookup():
        # A side effect: each lookup is a transfer the host serves, in order.
        (rows,) = xla_custom_call.emit(LOOKUP, [indices], [dtype], [[n, encoding]], config,
                                       has_side_effect=True)
        return rows

    if not trainable:
        return lookup()
    collection = tf.compat.v1.get_collection_ref(tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES)
    if not any(v is anchor_variable for v in collection):
        collection.append(anchor_variable)

    @tf.custom_gradient
    def trainable_lookup(anchor_value):
        del anchor_value

        def grad(dy):
            (zero,) = xla_custom_call.emit(UPDATE, [indices, tf.cast(dy, dtype)], [dtype], [[]],
                                           config, has_side_effect=True)
            return zero

        return lookup(), grad

    return trainable_lookup(anchor_variable.read_value())


def register(name, variable):
    """The host serves embedding `name` from `variable`'s value (until
    deregister); returns its host table."""
    table = _entry(name)[0]
    table.load(variable.numpy())
    return table


def deregister(name, variable):
    """Stop serving embedding `name` and write the host's table back to
    `variable`."""
    value = _entry(name)[0].unload()
    if value is not None:
        variable.assign(value)
    return variable
