"""Infeeds and outfeeds of TensorFlow programs: host data streams.

An infeed is a tf.data dataset streamed into a compiled program: each
`dequeue()` made while the program is traced becomes, per component of the
dataset's elements, an XLA recv (gen_xla_ops.xla_recv) tagged with the
stream (attributes.py); the importer turns it into a stream_from_host
primitive, whose kernel asks this module's `Infeed` for the next element
when the simulated IPU gets there. An outfeed is the other direction:
`enqueue(x)` becomes xla_send ops and the host side keeps what the
program sent (all of it, or the last value).

This is how Poplar runs them: data streams with host callbacks, one
element per dequeue, the dataset read as the device consumes it.
"""

import collections
import itertools
import threading

import numpy as np

from keras_ipu.device import host_streams
from keras_ipu.frontends.tensorflow.attributes import frontend_attributes
from keras_ipu.frontends.tensorflow.function import tracing_for_ipu
from keras_ipu.frontends.tensorflow.opcodes.effects import COMPONENT_ATTRIBUTE
from keras_ipu.frontends.tensorflow.opcodes.effects import STREAM_ATTRIBUTE

_sites = itertools.count()


def _replica():
    """(index, count) of the replica whose program calls the host now."""
    from keras_ipu.device.simulator import replicas

    here = replicas.current()
    return (0, 1) if here is None else (here[1], here[0].n)


class FeedError(RuntimeError):
    pass


def _require_trace(what):
    if not tracing_for_ipu():
        raise FeedError(
            f"{what} can only run inside a function compiled for the IPU: call "
            "it in the function you pass to IPUStrategy.run (or to "
            "ipu_compiler.compile / loops.repeat inside it)."
        )


def _tensor_name(kind, stream, component):
    return f"keras_ipu_{kind}_{stream}_{component}_{next(_sites)}"


class Infeed:
    """The host side of an infeed: the elements of `source` (a tf.data
    dataset, or an iterator over one that the user made already), one per
    dequeue."""

    def __init__(self, source, name="infeed"):
        import tensorflow as tf

        self.name = name
        is_dataset = isinstance(source, tf.data.Dataset)
        self.dataset = source if is_dataset else None
        self.element_spec = source.element_spec
        self.specs = tf.nest.flatten(self.element_spec)
        for spec in self.specs:
            if not isinstance(spec, tf.TensorSpec):
                raise ValueError(
                    f"{name}: the dataset's element {self.element_spec} holds "
                    f"{type(spec).__name__}; an infeed streams dense tensors only."
                )
            if not spec.shape.is_fully_defined():
                raise ValueError(
                    f"{name}: all dimensions of the dataset's output shapes must "
                    f"be fully defined, got {spec.shape} ({self.element_spec}). "
                    "IPU programs have static shapes: batch with "
                    "`dataset.batch(n, drop_remainder=True)`."
                )
        self.stream_id = host_streams.register(self)
        self._iterator = None if is_dataset else source
        # replica -> one queue per component: replica r of n reads elements
        # r, r + n, r + 2n, ... (an element per replica per dequeue).
        self._pending = {}
        self._lock = threading.Lock()
        self.elements_read = 0
        # The elements read since begin_execution() (for replay), or None.
        self._recorded = None
        self._replicas = 1

    # -- host side (called by the simulator) -----------------------------------

    def _next_element(self):
        import tensorflow as tf

        if self._iterator is None:
            self._iterator = iter(self.dataset)
        try:
            element = next(self._iterator)
        except StopIteration:
            raise tf.errors.OutOfRangeError(
                None, None,
                f"{self.name}: the dataset ran out of elements after "
                f"{self.elements_read}; the program asked for more. Repeat the "
                "dataset (`dataset.repeat()`) or run fewer steps.") from None
        self.elements_read += 1
        values = [np.asarray(v) for v in tf.nest.flatten(element)]
        if self._recorded is not None:
            self._recorded.append(values)
        return values

    def _queues(self, replica):
        queues = self._pending.get(replica)
        if queues is None:
            queues = self._pending[replica] = [collections.deque() for _ in self.specs]
        return queues

    def _distribute(self, elements):
        for j, values in enumerate(elements):
            for queue, value in zip(self._queues(j % self._replicas), values):
                queue.append(value)

    def receive(self, component, shape, dtype):
        replica, count = _replica()
        with self._lock:
            self._replicas = count
            queue = self._queues(replica)[component]
            if not queue:
                # One element for every replica: a replica short of its
                # element would wait for the others forever.
                self._distribute([self._next_element() for _ in range(count)])
            return queue.popleft()

    # -- trace side ------------------------------------------------------------

    def dequeue(self):
        """The next element, as XLA recvs (inside a function traced for the
        IPU)."""
        import tensorflow as tf
        from tensorflow.compiler.tf2xla.ops import gen_xla_ops

        _require_trace(f"Reading the infeed {self.name!r}")
        values = []
        for i, spec in enumerate(self.specs):
            with frontend_attributes({STREAM_ATTRIBUTE: self.stream_id,
                                      COMPONENT_ATTRIBUTE: i}):
                values.append(gen_xla_ops.xla_recv(
                    dtype=spec.dtype, shape=spec.shape,
                    tensor_name=_tensor_name("infeed", self.stream_id, i)))
        return tf.nest.pack_sequence_as(self.element_spec, values)

    def rebind(self, iterator):
        """Read from `iterator` (an iterator over elements of the same
        spec) from now on."""
        if iterator is not self._iterator:
            self._iterator = iterator
            self._pending.clear()

    def begin_execution(self):
        """Record the elements read from now on (see replay_execution)."""
        self._recorded = []

    @property
    def recorded(self):
        return len(self._recorded or ())

    def replay_execution(self):
        """Serve the elements read since begin_execution() again, then go on
        with the source: a program that stopped because the data ran out
        runs again on the elements it had."""
        recorded, self._recorded = self._recorded or [], None
        self._pending.clear()
        self._distribute(recorded)

    def reset(self):
        """Start the dataset again (a new iterator); an infeed over an
        iterator drops what it buffered."""
        if self.dataset is not None:
            self._iterator = None
        self._pending.clear()


class Outfeed:
    """The host side of an outfeed: what the program enqueued, every value
    (`keep="all"`) or the last one (`keep="last"`)."""

    def __init__(self, keep="all", name="outfeed"):
        if keep not in ("all", "last"):
            raise ValueError(f"Outfeed keep={keep!r} is not 'all' or 'last'.")
        self.keep = keep
        self.name = name
        self.structure = None
        self.stream_id = host_streams.register(self)
        self._lock = threading.Lock()
        self._values = {}  # replica -> per component: the values it sent

    # -- host side --------------------------------------------------------------

    def send(self, component, value):
        replica, _ = _replica()
        with self._lock:
            sent = self._values.setdefault(replica, [])
            while len(sent) <= component:
                sent.append([])
            if self.keep == "last":
                sent[component][:] = [value]
            else:
                sent[component].append(value)

    def take(self):
        """(structure, per-leaf list of values) sent so far; clears them.
        With several replicas each value has a replica axis first (replica
        0's value, then replica 1's, ...)."""
        with self._lock:
            sent, self._values = self._values, {}
        if len(sent) <= 1:
            return self.structure, sent.get(0, [])
        replicas = [sent[r] for r in sorted(sent)]
        values = []
        for component in range(len(replicas[0])):
            per_replica = [rep[component] for rep in replicas]
            count = min(len(v) for v in per_replica)
            values.append([np.stack([v[k] for v in per_replica]) for k in range(count)])
        return self.structure, values

    # -- trace side ---------------------------------------------------------------

    def enqueue(self, tensors):
        """Send `tensors` (a tensor, or a tuple/list/dict of them) to the
        host (inside a function traced for the IPU). Returns the send ops."""
        import tensorflow as tf
        from tensorflow.compiler.tf2xla.ops import gen_xla_ops

        _require_trace(f"Writing the outfeed {self.name!r}")
        leaves = tf.nest.flatten(tensors)
        structure = tf.nest.map_structure(lambda _: 0, tensors)
        if self.structure is not None and not _same_structure(self.structure, structure):
            raise ValueError(
                f"{self.name}: every enqueue must have the same structure; got "
                f"{structure!r} after {self.structure!r}."
            )
        self.structure = structure
        ops = []
        for i, leaf in enumerate(leaves):
            leaf = tf.convert_to_tensor(leaf)
            with frontend_attributes({STREAM_ATTRIBUTE: self.stream_id,
                                      COMPONENT_ATTRIBUTE: i}):
                ops.append(gen_xla_ops.xla_send(
                    leaf, tensor_name=_tensor_name("outfeed", self.stream_id, i)))
        return tf.group(*ops)


def _same_structure(a, b):
    import tensorflow as tf

    try:
        tf.nest.assert_same_structure(a, b)
        return True
    except (ValueError, TypeError):
        return False
