"""tensorflow.python.ipu.ipu_infeed_queue: a tf.data dataset streamed into
programs compiled for the IPU.

The queue's elements reach the program through a host data stream
(keras_ipu/frontends/tensorflow/feeds.py): each dequeue in the compiled
function reads the next element when the simulated IPU gets there, so a
loop of `n` steps reads `n` elements in one program run. Use it from
`loops.repeat` / `loops.while_loop` (the loop dequeues for its body) or,
in TensorFlow 2 code, iterate over it inside the function given to
`IPUStrategy.run` (`next(iterator)`). TensorFlow is imported when a queue is
made.
"""

from keras_ipu.frontends.tensorflow.feeds import Infeed

_LEGACY = ("feed_name", "replication_factor", "data_to_prefetch")


class IPUInfeedQueue:
    """Wraps a tf.data.Dataset for the IPU (see the module doc).

    Args:
      dataset: a tf.data.Dataset whose every transformation (batch, shuffle,
        repeat, ...) is applied already; its element shapes must be fully
        defined (batch with drop_remainder=True).
      device_ordinal: the IPU the queue feeds ("/device:IPU:<ordinal>").
      prefetch_depth: elements Poplar may prefetch (> 0); the simulator reads
        elements as the program consumes them.
      optimise_latency: accepted for compatibility; no effect on the
        simulated host link.
    """

    def __init__(self, dataset, device_ordinal=0, prefetch_depth=None,
                 optimise_latency=False, **legacy):
        unknown = sorted(set(legacy) - set(_LEGACY))
        if unknown:
            raise TypeError(f"IPUInfeedQueue got unexpected keyword arguments {unknown}.")
        if prefetch_depth is not None and prefetch_depth <= 0:
            raise ValueError(
                f"prefetch_depth must be greater than zero, got {prefetch_depth}.")
        if not isinstance(device_ordinal, int) or device_ordinal < 0:
            raise ValueError(f"Device ordinal must be an integer >= 0, got {device_ordinal!r}.")
        self._infeed = Infeed(dataset, name=legacy.get("feed_name") or "IPUInfeedQueue")
        self._device_ordinal = device_ordinal
        self._prefetch_depth = prefetch_depth
        self._dequeued = False
        self._initialized = False
        self._deleted = False

    # -- properties of Graphcore's API ---------------------------------------

    @property
    def dequeued(self):
        """Whether this queue has been dequeued."""
        return self._dequeued

    @property
    def number_of_tuple_elements(self):
        """The number of arguments the queue's elements supply (to a loop
        body)."""
        spec = self._infeed.element_spec
        if isinstance(spec, (tuple, list, dict)):
            return len(spec)
        return 1

    @property
    def initializer(self):
        """Nothing to run in TensorFlow 2 (the dataset is read when the
        program needs it); may be read once, as Graphcore's."""
        if self._initialized:
            raise ValueError(
                "The IPUInfeedQueue `initializer` function can only be accessed once.")
        self._initialized = True
        return None

    @property
    def deleter(self):
        """Deletes the queue's host stream; the dataset is not read again."""
        self._deleted = True
        self._infeed.reset()
        return None

    @property
    def element_spec(self):
        return self._infeed.element_spec

    # -- reading -----------------------------------------------------------------

    def _dequeue(self):
        """The next element (inside a function compiled for the IPU)."""
        if self._deleted:
            raise ValueError("This IPUInfeedQueue was deleted (its `deleter` ran).")
        self._dequeued = True
        return self._infeed.dequeue()

    def get_next(self):
        """The next element (TensorFlow 2 style, inside the compiled function)."""
        return self._dequeue()

    def __iter__(self):
        return self

    def __next__(self):
        return self._dequeue()


class IPUOwnedIterator(IPUInfeedQueue):
    """An iterator over a dataset for IPU programs: a tf.data iterator
    passed to `IPUStrategy.run` is streamed through one. `dataset` may be a
    dataset or an iterator over one (read from where it stands)."""
