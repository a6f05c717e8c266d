"""dataset_benchmark / infeed_benchmark: Graphcore's JSON of per-epoch
host throughput, counted from the dataset's own elements."""

import json

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

import keras_ipu as ipu  # noqa: E402


def dataset():
    return tf.data.Dataset.range(10).map(lambda i: tf.fill([4, 4], tf.cast(i, tf.float32))).repeat()


def test_dataset_benchmark_counts_each_epochs_elements_and_bytes(capsys):
    out = ipu.dataset_benchmark.dataset_benchmark(dataset(), 3, 50)
    assert out.shape == (1,) and out.dtype == tf.string
    epochs = json.loads(out.numpy()[0])["epochs"]
    assert len(epochs) == 3
    for e in epochs:
        assert e["elements_processed"] == 50
        assert e["total_bytes_processed"] == 50 * 16 * 4
        assert e["time_elapsed"] > 0
        np.testing.assert_allclose(e["elements_per_second"], 50 / e["time_elapsed"])
        np.testing.assert_allclose(e["bandwidth"], 3200 / e["time_elapsed"] / 1e9)
    assert capsys.readouterr().err.count("Epoch ") == 3


def test_infeed_benchmark_reads_the_queues_dataset():
    queue = ipu.ipu_infeed_queue.IPUInfeedQueue(dataset().batch(2, drop_remainder=True))
    out = ipu.dataset_benchmark.infeed_benchmark(queue, 2, 5, print_stats=False)
    epochs = json.loads(out.numpy()[0])["epochs"]
    assert [e["total_bytes_processed"] for e in epochs] == [5 * 2 * 64] * 2


def test_errors():
    with pytest.raises(ValueError, match="ran out after 10 elements"):
        ipu.dataset_benchmark.dataset_benchmark(tf.data.Dataset.range(10), 1, 20,
                                                print_stats=False)
    with pytest.raises(ValueError, match="`number_of_epochs` to be at least 1"):
        ipu.dataset_benchmark.dataset_benchmark(dataset(), 0, 1)
    with pytest.raises(TypeError, match="tf.data.Dataset"):
        ipu.dataset_benchmark.dataset_benchmark([1, 2], 1, 1)
    with pytest.raises(TypeError, match="IPUInfeedQueue"):
        ipu.dataset_benchmark.infeed_benchmark(dataset(), 1, 1)
