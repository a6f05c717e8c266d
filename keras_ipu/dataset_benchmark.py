"""keras_ipu.dataset_benchmark: Graphcore's `tensorflow.python.ipu.dataset_benchmark`.

How fast the host produces a dataset's elements, the way Graphcore's
benchmark measures it: one iterator over the dataset, `number_of_epochs`
timed runs of `elements_per_epochs` elements each, each element's buffers
copied once (`do_memcpy`, standing for the copy into Poplar's stream
buffers). These are measurements of this host, not simulator predictions.
The result is Graphcore's: a [1] string tensor holding
{"epochs": [{elements_processed, total_bytes_processed, time_elapsed,
elements_per_second, bandwidth (GB/s)}, ...]}.
"""

import json
import sys
import time


def _element_buffers(element):
    import numpy as np
    import tensorflow as tf

    return [np.asarray(t) for t in tf.nest.flatten(element)]


def _epoch(iterator, elements, do_memcpy):
    import numpy as np

    processed = total_bytes = 0
    start = time.perf_counter()
    for _ in range(elements):
        try:
            buffers = _element_buffers(next(iterator))
        except StopIteration:
            raise ValueError(
                f"The dataset ran out after {processed} elements of an epoch of "
                f"{elements}: give a dataset with enough elements for every epoch "
                "(dataset.repeat()).") from None
        for b in buffers:
            if b.size == 0:
                raise ValueError(
                    f"The dataset has an element of shape {b.shape}, with a dimension "
                    "of size 0: it cannot be benchmarked.")
            if do_memcpy:
                np.copy(b)
            total_bytes += b.nbytes
        processed += 1
    elapsed = max(time.perf_counter() - start, sys.float_info.min)
    return {
        "elements_processed": processed,
        "total_bytes_processed": total_bytes,
        "time_elapsed": elapsed,
        "elements_per_second": processed / elapsed,
        "bandwidth": total_bytes / elapsed / 1e9,
    }


def dataset_benchmark(dataset, number_of_epochs, elements_per_epochs, print_stats=True,
                      apply_options=True, do_memcpy=True):
    """Benchmark a tf.data.Dataset (see the module doc). `apply_options`
    applies the dataset's optimisation options (tf.data's defaults are in
    force either way in TensorFlow 2)."""
    import tensorflow as tf

    if number_of_epochs < 1:
        raise ValueError("Expected `number_of_epochs` to be at least 1.")
    if elements_per_epochs < 1:
        raise ValueError("Expected `elements_per_epochs` to be at least 1.")
    if not isinstance(dataset, tf.data.Dataset):
        raise TypeError("Expected `dataset` argument to be of type `tf.data.Dataset`, "
                        f"but got {dataset} instead.")
    del apply_options
    iterator = iter(dataset)
    epochs = []
    for i in range(number_of_epochs):
        stats = _epoch(iterator, elements_per_epochs, do_memcpy)
        epochs.append(stats)
        if print_stats:
            print(f"Epoch {i}: {stats['elements_processed']} elements, "
                  f"{stats['time_elapsed']:.6f} s, {stats['elements_per_second']:.1f} "
                  f"elements/s, {stats['bandwidth']:.6f} GB/s", file=sys.stderr)
    return tf.constant([json.dumps({"epochs": epochs})])


def infeed_benchmark(infeed_queue, number_of_epochs, elements_per_epochs, print_stats=True,
                     do_memcpy=True):
    """dataset_benchmark of the dataset an IPUInfeedQueue feeds."""
    from keras_ipu.ipu_infeed_queue import IPUInfeedQueue

    if not isinstance(infeed_queue, IPUInfeedQueue):
        raise TypeError("Expected `infeed_queue` argument to be of type "
                        "`ipu.ipu_infeed_queue.IPUInfeedQueue`, but got "
                        f"{infeed_queue} instead.")
    return dataset_benchmark(infeed_queue._infeed.dataset, number_of_epochs,
                             elements_per_epochs, print_stats=print_stats,
                             apply_options=False, do_memcpy=do_memcpy)
