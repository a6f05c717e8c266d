"""tensorflow.python.ipu.ipu_outfeed_queue: values sent from programs
compiled for the IPU to the host.

`enqueue(x)` inside the compiled function sends `x` (a tensor, or a
tuple/list/dict of tensors) through a host data stream each time it runs;
`dequeue()` on the host returns what arrived: every value, stacked on a new
first axis (IPUOutfeedMode.ALL), or the last one (IPUOutfeedMode.LAST).
With replication, a replica axis follows the enqueue axis.
"""

import enum

import numpy as np

from keras_ipu.frontends.tensorflow.feeds import Outfeed


class IPUOutfeedMode(enum.Enum):
    """ALL: dequeue returns every enqueued element; LAST: only the last."""

    ALL = 1
    LAST = 2


class IPUOutfeedQueue:
    """Generates outfeed enqueue/dequeue operations (see the module doc).

    Args:
      outfeed_mode: an IPUOutfeedMode (default ALL).
      device_ordinal: the IPU the queue reads from.
      buffer_depth: elements Poplar may buffer before blocking the device (> 0).
      optimise_latency: accepted for compatibility; no effect on the
        simulated host link.
    """

    def __init__(self, outfeed_mode=None, device_ordinal=0, buffer_depth=3,
                 optimise_latency=False, **legacy):
        unknown = sorted(set(legacy) - {"feed_name", "replication_factor", "io_batch_size"})
        if unknown:
            raise TypeError(f"IPUOutfeedQueue got unexpected keyword arguments {unknown}.")
        outfeed_mode = IPUOutfeedMode.ALL if outfeed_mode is None else outfeed_mode
        if not isinstance(outfeed_mode, IPUOutfeedMode):
            raise ValueError(
                "Expected `outfeed_mode` value to be of `IPUOutfeedMode` type, but "
                f"is {outfeed_mode!r}.")
        if not isinstance(device_ordinal, int) or device_ordinal < 0:
            raise ValueError(f"Device ordinal must be an integer >= 0, got {device_ordinal!r}.")
        if buffer_depth is None or buffer_depth <= 0:
            raise ValueError(f"buffer_depth must be greater than zero, got {buffer_depth}.")
        self._outfeed_mode = outfeed_mode
        keep = "all" if outfeed_mode == IPUOutfeedMode.ALL else "last"
        self._outfeed = Outfeed(keep, name=legacy.get("feed_name") or "IPUOutfeedQueue")
        self._device_ordinal = device_ordinal
        self._buffer_depth = buffer_depth
        self._enqueued = False
        self._leaf_specs = None

    @property
    def enqueued(self):
        """Whether enqueue has been called (in a traced program)."""
        return self._enqueued

    @property
    def deleter(self):
        """Drops what arrived and not yet dequeued."""
        self._outfeed.take()
        return None

    def enqueue(self, tensors):
        """Send a tensor, tuple/list or dict of tensors to the host (inside a
        function compiled for the IPU). Returns the operation that sends."""
        import tensorflow as tf

        op = self._outfeed.enqueue(tensors)
        self._leaf_specs = [(tuple(t.shape), t.dtype.as_numpy_dtype)
                            for t in (tf.convert_to_tensor(x) for x in tf.nest.flatten(tensors))]
        self._enqueued = True
        return op

    def dequeue(self, wait_for_completion=False):
        """What the programs sent since the last dequeue: per leaf, a
        [n, ...] tensor (ALL; [n, replicas, ...] with replication) or the
        last value (LAST; [replicas, ...] with replication)."""
        import tensorflow as tf

        from keras_ipu import utils

        structure, values = self._outfeed.take()
        if structure is None:
            raise ValueError(
                "The outfeed has not been enqueued to: call "
                "`outfeed_queue.enqueue(...)` in the function compiled for the IPU "
                "(and run it) before dequeuing.")
        synthetic = utils.use_synthetic_data_for(utils.SyntheticDataCategory.Outfeed)
        leaves = []
        for i, (shape, dtype) in enumerate(self._leaf_specs):
            got = values[i] if i < len(values) else []
            if self._outfeed_mode == IPUOutfeedMode.LAST:
                if not got or synthetic:
                    raise ValueError(
                        "The outfeed is in IPUOutfeedMode.LAST and holds no element: "
                        + ("--use_synthetic_data returns no data." if synthetic else
                           "nothing was enqueued since the last dequeue."))
                leaves.append(tf.convert_to_tensor(got[-1]))
            else:
                if synthetic:
                    got = []
                stacked = np.stack(got) if got else np.zeros((0,) + shape, dtype)
                leaves.append(tf.convert_to_tensor(stacked))
        return tf.nest.pack_sequence_as(structure, leaves)

    def __iter__(self):
        """Each element sent since the last dequeue (IPUOutfeedMode.ALL)."""
        import tensorflow as tf

        if self._outfeed_mode != IPUOutfeedMode.ALL:
            raise ValueError("Only an outfeed in IPUOutfeedMode.ALL can be iterated.")
        values = self.dequeue()
        leaves = tf.nest.flatten(values)
        n = int(leaves[0].shape[0]) if leaves else 0
        for i in range(n):
            yield tf.nest.pack_sequence_as(values, [leaf[i] for leaf in leaves])


class ScopedIPUOutfeedQueue(IPUOutfeedQueue):
    """An IPUOutfeedQueue whose undelivered data is dropped when its `with`
    block ends."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._outfeed.take()
        return False
