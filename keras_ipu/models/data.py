"""The infeed of an IPU-extended model: batches per execution, as
Graphcore's IPUDataHandler hands them out.

- The batches of an epoch are dealt to the replicas: each replica runs
  `batches // replicas` steps (the progress bar counts those); a remainder
  is dropped with a warning.
- `steps_per_execution` counts one replica's steps: an execution takes
  `replicas x steps_per_execution` batches. It must divide the steps of a
  replica (ValueError); larger than them, it is cut to them (warning).
- A partial batch is an error: the IPU runs programs of fixed shapes.
- float64 data is cast to float32 (as Graphcore's autocast of datasets).
- Data of unknown size needs `steps_per_epoch` / `steps`; a Python
  generator (whose shapes are unknown until it runs) is refused, as
  Graphcore's IPUDataHandler refuses it.
"""

import logging

import numpy as np

from keras.src import tree

from keras_ipu.backend.trainer import IPUEpochIterator

logger = logging.getLogger("keras_ipu")


def _autocast(batch):
    def cast(x):
        if isinstance(x, np.ndarray) and x.dtype == np.float64:
            return x.astype(np.float32)
        if hasattr(x, "dtype") and str(getattr(x, "dtype", "")) in ("float64", "<dtype: 'float64'>"):
            return np.asarray(x, dtype=np.float32)
        return x

    return tree.map_structure(cast, batch)


class IPUDataIterator(IPUEpochIterator):
    """An epoch of executions of `replicas x steps_per_execution` batches
    (see the module doc); `num_batches` is per replica."""

    def __init__(self, *, replicas, **kwargs):
        super().__init__(**kwargs)
        adapter = self.data_adapter
        if type(adapter).__name__ == "GeneratorDataAdapter":
            x = kwargs.get("x")
            raise ValueError(
                f"The provided set of data is of type `{type(x).__name__}` which is "
                "not compatible with the IPU's requirement to know the data shape "
                "ahead of time. Please use `tf.data.Dataset.from_generator()` to "
                "specify the shape of your data (or a keras.utils.PyDataset)."
            )
        # A callable: the replication factor depends on the data (a
        # subclassed model traces its graph from the first batch's shapes).
        replicas = replicas(self) if callable(replicas) else replicas
        self.replicas = replicas
        if getattr(adapter, "has_partial_batch", False):
            raise ValueError(
                "The provided set of data has a partial batch, which could result "
                "in data being dropped. Either adjust the `batch_size` of your "
                f"model (currently set to {adapter.batch_size}) or pad your dataset "
                "to ensure there are no partial batches."
            )
        total = self.steps_per_epoch or self._num_batches
        if total is None:
            raise ValueError(
                "Could not infer the size of the data. You must specify the "
                "number of steps to run."
            )
        if total % replicas:
            left = total % replicas
            logger.warning(
                "Dataset of length %d is being evenly distributed between %d "
                "replicas. The remaining %d batch%s will be dropped.",
                total, replicas, left, "es" if left > 1 else "",
            )
        per_replica = total // replicas
        if per_replica == 0:
            raise ValueError(
                f"The provided dataset contains {total} items, but all {replicas} "
                "replicas are requested to run 1 steps each. Make sure the "
                f"dataset contains at least {replicas} items."
            )
        to_replica = " to this replica" if replicas > 1 else ""
        spe = self.steps_per_execution
        if spe > per_replica:
            logger.warning(
                "`steps_per_execution` has been set to %d but the dataset "
                "provided%s only contains %d batches. Using %d as "
                "`steps_per_execution`.", spe, to_replica, per_replica, per_replica,
            )
            spe = per_replica
        if per_replica % spe:
            raise ValueError(
                f"`steps_per_execution` ({spe}) must be a divisor of the number of "
                f"batches ({per_replica}) in the dataset provided{to_replica}."
            )
        self.steps_per_execution = spe
        self.per_replica_batches = per_replica
        if self.steps_per_epoch:
            self.steps_per_epoch = per_replica
        else:
            self._num_batches = per_replica

    def first_batch(self):
        """The first batch of the data, from a fresh pass over it (the
        epoch's own pass is left as it is)."""
        return next(iter(self.data_adapter.get_numpy_iterator()))

    def reset(self):
        super().reset()
        if not self.steps_per_epoch:
            self._num_batches = self.per_replica_batches

    def __next__(self):
        if self._peeked is not None:
            item, self._peeked = self._peeked, None
            return item
        begin_step, _, iterator = next(self._epoch_iterator)
        wanted = self.steps_per_execution * self.replicas
        batches = []
        with self.catch_stop_iteration():
            for _ in range(wanted):
                batches.append(_autocast(next(iterator)))
        if len(batches) < wanted:
            # The input ran out inside an execution: the IPU runs whole
            # executions only (catch_stop_iteration has warned).
            raise StopIteration
        return begin_step, begin_step + self.steps_per_execution - 1, batches
