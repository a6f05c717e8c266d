"""keras_ipu.data.ops.dataset_ops: Graphcore's
`tensorflow.python.ipu.data.ops.dataset_ops` (BufferDataset).

Graphcore's BufferDataset is a C++ dataset kernel: it reads `buffer_size`
elements into a buffer before handing out the first of them, and drops a
last group that cannot be filled (so the number of elements is a multiple
of `buffer_size`; an infeed of `buffer_size` steps never waits half way).
Here the same iterator is built from TensorFlow's own datasets: `window`
with `drop_remainder=True` holds one full group before it yields, and
`flat_map` hands its elements out one at a time. The cardinality is
Graphcore's, n - n % buffer_size (unknown and infinite pass through).
"""

import tensorflow as tf
from tensorflow.python.data.ops import dataset_ops as _tf_dataset_ops

# Graphcore's kernel refuses a buffer size below one with this message.
_NOT_POSITIVE = "Buffer size must be greater than zero."


def _buffer_size_tensor(buffer_size):
    size = tf.convert_to_tensor(buffer_size, dtype=tf.int64, name="buffer_size")
    known = tf.get_static_value(size)
    if known is not None and known <= 0:
        raise tf.errors.InvalidArgumentError(
            None, None, f"{_NOT_POSITIVE} Got buffer_size={int(known)}.")
    return size


def _full_groups(dataset, size):
    """`dataset`'s elements, read in groups of `size`, the incomplete last
    group dropped."""

    def elements(*window):
        # flat_map passes a tuple element's datasets as separate arguments
        # and any other structure as one.
        return tf.data.Dataset.zip(window if len(window) > 1 else window[0])

    grouped = dataset.window(size, drop_remainder=True).flat_map(elements)
    # window + flat_map loses the count; Graphcore's kernel states it. It can
    # only be stated when known here (an assertion of "unknown" would fail).
    count = tf.get_static_value(dataset.cardinality())
    size = tf.get_static_value(size)
    if count is None or size is None or count == tf.data.UNKNOWN_CARDINALITY:
        return grouped
    if count != tf.data.INFINITE_CARDINALITY:
        count -= count % size
    return grouped.apply(tf.data.experimental.assert_cardinality(count))


class BufferDataset(_tf_dataset_ops.UnaryUnchangedStructureDataset):
    """A Dataset which makes sure there is a multiple of `buffer_size`
    number of elements available."""

    def __init__(self, input_dataset, buffer_size):
        """A Dataset which makes sure there is a multiple of `buffer_size`
        number of elements available.

        Args:
          input_dataset: The input dataset.
          buffer_size: The number of dataset elements which will be
            available.
        """
        self._input_dataset = input_dataset
        self._buffer_size = _buffer_size_tensor(buffer_size)
        grouped = _full_groups(input_dataset, self._buffer_size)
        super().__init__(input_dataset, grouped._variant_tensor)  # pylint: disable=protected-access
