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

import numpy as np

from keras_ipu.device import host_streams
from keras_ipu.frontends.tensorflow.attributes import frontend_attributes
from keras_ipu.frontends.tensorflow.function import tracing_for_ipu
from keras_ipu.frontends.tensorflow.opcodes.effects import COMPONENT_ATTRIBUTE
from keras_ipu.frontends.tensorflow.opcodes.effects import STREAM_ATTRIBUTE

_sites = itertools.count()


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
        self._pending = [collections.deque() for _ in self.specs]
        self.elements_read = 0

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
        for queue, value in zip(self._pending, tf.nest.flatten(element)):
            queue.append(np.asarray(value))

    def receive(self, component, shape, dtype):
        queue = self._pending[component]
        if not queue:
            self._next_element()
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

    def reset(self):
        """Start the dataset again (a new iterator); an infeed over an
        iterator drops what it buffered."""
        if self.dataset is not None:
            self._iterator = None
        for queue in self._pending:
            queue.clear()


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
        self._values = []

    # -- host side --------------------------------------------------------------

    def send(self, component, value):
        while len(self._values) <= component:
            self._values.append([])
        if self.keep == "last":
            self._values[component][:] = [value]
        else:
            self._values[component].append(value)

    def take(self):
        """(structure, per-leaf list of values) sent so far; clears them."""
        values, self._values = self._values, []
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
