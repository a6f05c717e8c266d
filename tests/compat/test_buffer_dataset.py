"""data.ops.dataset_ops.BufferDataset: Graphcore's dataset that reads
`buffer_size` elements ahead and keeps a multiple of `buffer_size` of them
(the cases of graphcore/tensorflow's buffer_dataset_op_test.cc)."""

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

import keras_ipu as ipu  # noqa: E402
from keras_ipu.data.ops.dataset_ops import BufferDataset  # noqa: E402


def _values(dataset):
    return [int(x) for x in dataset.as_numpy_iterator()]


@pytest.mark.parametrize("buffer_size, kept", [(5, 10), (3, 9), (1, 10), (11, 0)])
def test_keeps_whole_buffers_in_order(buffer_size, kept):
    dataset = BufferDataset(tf.data.Dataset.range(10), buffer_size)
    assert isinstance(dataset, tf.data.Dataset)
    assert _values(dataset) == list(range(kept))
    assert int(dataset.cardinality()) == kept
    assert dataset.element_spec == tf.TensorSpec([], tf.int64)


def test_cardinality_unknown_and_infinite_pass_through():
    unknown = tf.data.Dataset.range(10).filter(lambda x: x < 7)
    assert int(BufferDataset(unknown, 3).cardinality()) == tf.data.UNKNOWN_CARDINALITY
    assert _values(BufferDataset(unknown, 3)) == list(range(6))
    infinite = BufferDataset(tf.data.Dataset.range(4).repeat(), 3)
    assert int(infinite.cardinality()) == tf.data.INFINITE_CARDINALITY
    assert _values(infinite.take(7)) == [0, 1, 2, 3, 0, 1, 2]


def test_structures_are_kept():
    base = tf.data.Dataset.range(6)
    tuples = base.map(lambda x: (x, tf.fill([2], x * 2)))
    dicts = base.map(lambda x: {"a": x, "b": (tf.cast(x, tf.float32),)})
    singles = base.map(lambda x: (x,))
    for source in (tuples, dicts, singles):
        got = list(BufferDataset(source, 4).as_numpy_iterator())
        want = list(source.take(4).as_numpy_iterator())
        assert BufferDataset(source, 4).element_spec == source.element_spec
        assert len(got) == 4
        for g, w in zip(got, want):
            tf.nest.map_structure(np.testing.assert_array_equal, g, w)


def test_reads_a_whole_buffer_before_the_first_element():
    pulled = []

    def generator():
        for i in range(8):
            pulled.append(i)
            yield i

    source = tf.data.Dataset.from_generator(generator, output_signature=tf.TensorSpec([], tf.int64))
    # TensorFlow's default pipeline optimisation prefetches the last stage:
    # off, so that what the generator yields is what BufferDataset pulled.
    options = tf.data.Options()
    options.experimental_optimization.inject_prefetch = False
    options.autotune.enabled = False
    iterator = iter(BufferDataset(source, 4).with_options(options))
    assert int(next(iterator)) == 0
    assert pulled == [0, 1, 2, 3]
    for _ in range(3):
        next(iterator)
    assert pulled == [0, 1, 2, 3]
    assert int(next(iterator)) == 4 and pulled == list(range(8))


@pytest.mark.parametrize("size", [0, -2])
def test_a_buffer_size_below_one_is_refused(size):
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=f"Buffer size must be greater than zero. Got buffer_size={size}"):
        BufferDataset(tf.data.Dataset.range(10), size)


def test_feeds_a_compiled_loop():
    data = np.arange(24, dtype=np.float32).reshape(6, 4)
    infeed = ipu.ipu_infeed_queue.IPUInfeedQueue(
        BufferDataset(tf.data.Dataset.from_tensor_slices(data), 3))

    def body(total, x):
        return total + tf.reduce_sum(x)

    def net(start):
        return ipu.loops.repeat(3, body, [start], infeed)

    with ipu.scopes.ipu_scope("/device:IPU:0"):
        result = ipu.ipu_compiler.compile(net, inputs=[tf.constant(0.0)])
    np.testing.assert_allclose(result[0].numpy(), data[:3].sum())
