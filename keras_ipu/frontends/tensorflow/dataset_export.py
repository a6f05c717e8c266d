"""Exporting infeed data to binary files (utils.export_dataset_to_file,
utils.export_inputs_to_file).

Format: the elements' tensors, one after the other, each in row-major
order with its dtype's native little-endian bytes and nothing between them
(numpy's `tofile`): a file of n elements of shape S and dtype D holds
n * prod(S) * D.itemsize bytes and reads back with
`np.fromfile(path, D).reshape((n,) + S)`. One file per component of the
elements: `name.<i>.<ext>` when there are several (in the order
tf.nest.flatten gives them), `name` itself for one. Every file is written
under a temporary name and renamed, so it is complete or absent.
"""

import os

import numpy as np


def _paths(output_filename, count):
    if count == 1:
        return [output_filename]
    stem, ext = os.path.splitext(output_filename)
    return [f"{stem}.{i}{ext}" for i in range(count)]


def _write_all(paths, per_file_chunks):
    temps = []
    try:
        for path, chunks in zip(paths, per_file_chunks):
            directory = os.path.dirname(os.path.abspath(path))
            temp = os.path.join(directory, f".tmp-{os.getpid()}-{os.path.basename(path)}")
            temps.append((temp, path))
            with open(temp, "wb") as f:
                for chunk in chunks:
                    np.ascontiguousarray(chunk).tofile(f)
                f.flush()
                os.fsync(f.fileno())
        for temp, path in temps:
            os.replace(temp, path)
    finally:
        for temp, _ in temps:
            if os.path.exists(temp):
                os.remove(temp)


def export_dataset_to_file(dataset_or_infeed, output_filename, num_elements,
                           feed_name="", apply_options=True):
    """Write the first `num_elements` elements of a dataset (or of an
    IPUInfeedQueue's dataset) to binary files (format: module doc)."""
    import tensorflow as tf

    from keras_ipu.ipu_infeed_queue import IPUInfeedQueue

    if isinstance(dataset_or_infeed, IPUInfeedQueue):
        dataset = dataset_or_infeed._infeed.dataset  # noqa: SLF001 - same package
    elif isinstance(dataset_or_infeed, tf.data.Dataset):
        dataset = dataset_or_infeed
    else:
        raise ValueError(
            "export_dataset_to_file needs a tf.data.Dataset or an IPUInfeedQueue, "
            f"got {type(dataset_or_infeed).__name__}.")
    if not isinstance(num_elements, int) or num_elements <= 0:
        raise ValueError(f"num_elements must be a positive integer, got {num_elements!r}.")
    if apply_options:
        options = tf.data.Options()
        options.experimental_optimization.apply_default_optimizations = True
        dataset = dataset.with_options(options)
    count = len(tf.nest.flatten(dataset.element_spec))
    chunks = [[] for _ in range(count)]
    read = 0
    for element in dataset.take(num_elements):
        for i, value in enumerate(tf.nest.flatten(element)):
            chunks[i].append(np.asarray(value))
        read += 1
    if read < num_elements:
        raise ValueError(
            f"The dataset holds {read} elements; {num_elements} were asked for.")
    _write_all(_paths(output_filename, count), chunks)


def export_inputs_to_file(inputs, output_filename, feed_dict):
    """Write the values of `inputs` (tensors; a value in `feed_dict` takes
    precedence, as a session feed would) to binary files, one per input."""
    inputs = list(inputs)
    values = []
    for x in inputs:
        if feed_dict and x in feed_dict:
            values.append(np.asarray(feed_dict[x]))
        elif hasattr(x, "numpy"):
            values.append(np.asarray(x.numpy()))
        else:
            raise ValueError(
                f"export_inputs_to_file: no value for input {x!r}: give it in "
                "feed_dict (symbolic tensors have no value in TensorFlow 2).")
    _write_all(_paths(output_filename, len(values)), [[v] for v in values])
