"""Keras' distribution API (keras.distribution) as IPU replication.

    keras.distribution.set_distribution(keras.distribution.DataParallel())
    model = keras.Sequential([...])      # gets the IPU extensions
    model.fit(x, y, batch_size=64)       # one replica per IPU of the mesh

A Keras model made while a distribution is set (globally or in its
`scope()`) gets the IPU extensions of a `KerasDistributionStrategy`: an
IPUStrategy on the device models run on (/device:IPU:0), whose replicas
are the mesh's batch axis. The model then trains by the same replication
machinery as one made in an IPUStrategy scope (models/extension.py,
simulator/replicas.py): each replica runs the step on its share of the
batch and the gradients are averaged over the replicas.

Two differences follow Keras rather than Graphcore. What a batch means: Keras' distribution splits the
*global* batch over the devices (`batch_size=64` on 4 devices is 16 per
device); an IPUStrategy model's batch is one replica's (Graphcore's
convention). So the data is re-batched to `batch_size / replicas` before
the IPU's infeed deals it out: replica r of a step gets the r-th slice of
the global batch, as JAX's data sharding gives device r. And the metrics
fit/evaluate report are the mean over the replicas (the global batch's),
not replica 0's (IPUStrategy's default, NONE).

ModelParallel with a model axis of k IPUs: each replica spans k
consecutive IPUs (`model_axis_ipus`, the shards of Graphcore's replication
factor), and the programs of fit/evaluate/predict are compiled split over
them as the variables' layouts say (`compile_options`, read by
models/execution.py): see compiler/tensor_parallel.py.

The backend side (devices, processes, layouts) is
keras_ipu/backend/distribution_lib.py.
"""

import dataclasses

from keras_ipu.backend import distribution_lib as backend_dlib
from keras_ipu.distribute.strategy import IPUStrategyV1

# Keras' batch size for arrays when fit/evaluate/predict get none.
_KERAS_DEFAULT_BATCH_SIZE = 32


def _replicas_of(distribution):
    return int(distribution.num_model_replicas)


class KerasDistributionStrategy(IPUStrategyV1):
    """The IPUStrategy a keras.distribution Distribution stands for (see
    the module doc). Made by scope.on_model_created."""

    def __init__(self, distribution):
        mesh = distribution.device_mesh
        indices = backend_dlib._to_backend_mesh(mesh)  # every device an IPU we have
        batch = distribution.batch_dim_name
        others = backend_dlib.model_axes(mesh, batch)
        if len(others) > 1:
            raise NotImplementedError(
                f"{type(distribution).__name__} over the mesh {dict(zip(mesh.axis_names, mesh.shape))} "
                f"splits the model over the axes {others}: " + backend_dlib.SPLIT_AXES_REASON
            )
        super().__init__()
        self._distribution = distribution
        # IPUs per replica: the model axis (tensor parallelism), 1 without.
        self.model_axis_ipus = next(iter(others.values()), 1)
        self._model_axis = next(iter(others), None)
        _check_ipu_order(mesh, indices, batch, self._model_axis)
        self._instances = _instances_training_together()

    def __repr__(self):
        return f"<KerasDistributionStrategy {self._distribution!r} on {self._ipu_device}>"

    def _patch_keras_extension(self, model):
        super()._patch_keras_extension(model)
        # Keras' metrics under a distribution are the global batch's: the
        # mean of the replicas' (equal batches), not one replica's, which is
        # what IPUStrategy reports by default (Graphcore's NONE).
        model.set_replication_options(replicated_metric_reduction_method="MEAN")
        if self._instances > 1:
            from keras_ipu.distributed import popdist_strategy

            popdist_strategy.synchronise_instances(model)

    def _model_data_arguments(self, model, mode, kwargs):
        """fit/evaluate/predict's data arguments with the global batch cut
        into one batch per replica; checks the replicas are the mesh's."""
        replicas = _replicas_of(self._distribution)
        self._check_replicas(model, replicas)
        self._check_variable_layouts(model)
        if replicas == 1:
            return kwargs
        kwargs = dict(kwargs)
        x = kwargs.get("x")
        if _is_tf_dataset(x):
            kwargs["x"] = _rebatched(x, replicas)
        else:
            from keras.src.trainers.data_adapters import array_data_adapter

            if not array_data_adapter.can_convert_arrays(
                    (x, kwargs.get("y"), kwargs.get("sample_weight"))):
                raise NotImplementedError(
                    f"{type(x).__name__} input under a keras.distribution "
                    f"{type(self._distribution).__name__}: the ipu backend splits the global "
                    "batch of arrays or of a tf.data.Dataset over the replicas; pass one "
                    "of those, or train in an IPUStrategy scope, where a batch is one "
                    "replica's."
                )
            size = kwargs.get("batch_size") or _KERAS_DEFAULT_BATCH_SIZE
            kwargs["batch_size"] = _per_replica(size, replicas, "batch_size")
        if kwargs.get("steps_per_epoch"):
            kwargs["steps_per_epoch"] = int(kwargs["steps_per_epoch"]) * replicas
        return kwargs

    def _check_replicas(self, model, replicas):
        actual = model._get_replication_factor()
        if actual != replicas:
            device = self._device()
            raise ValueError(
                f"The keras.distribution {type(self._distribution).__name__} has "
                f"{replicas} model replicas, but the model runs {actual} replica(s) on "
                f"{device.name}, which has {device.num_ipus} IPU(s). Make the mesh's batch "
                f"axis cover the IPUs of the device ({backend_dlib.list_devices()}), e.g. "
                "DataParallel() with no devices, or select as many IPUs with "
                "IPUConfig.auto_select_ipus."
            )

    def _check_variable_layouts(self, model):
        self._splits(model.variables)

    def _splits(self, variables):
        """{variable index: split dimension} of the variables the layouts
        split over the model axis (weight_split's checks on each)."""
        splits = {}
        batch = self._distribution.batch_dim_name
        for j, variable in enumerate(variables):
            split = backend_dlib.weight_split(
                self._distribution.get_variable_layout(variable),
                f"The variable {variable.path!r}", batch)
            if split is not None:
                splits[j] = split[0]
        return splits

    def compile_options(self, variables, options):
        """`options` (a program's CompileOptions) for a program whose first
        inputs are `variables`: split over the model axis as their layouts
        say (compiler/tensor_parallel.py); unchanged without a model axis."""
        if self.model_axis_ipus == 1:
            return options
        from keras_ipu.device.compiler.options import CompileOptions
        from keras_ipu.device.compiler.tensor_parallel import TensorParallel

        split = TensorParallel.of(self.model_axis_ipus, self._splits(variables),
                                  {j: v.path for j, v in enumerate(variables)},
                                  self._model_axis)
        return dataclasses.replace(options or CompileOptions(), tensor_parallel=split)


def _instances_training_together():
    """The processes of the job (1 alone). In a job of several (poprun /
    mpirun), each process's mesh covers its own IPUs (list_devices()), and
    its replicas train with every other process's as one data-parallel job:
    the compiled all-reduces add the processes' gradients over MPI, as
    PopDistStrategy's do, which needs the configured system's
    multi_replica_distribution to span the job."""
    from keras_ipu.device.config import system_config

    processes = backend_dlib.num_processes()
    if processes == 1:
        return 1
    instances, _ = system_config.configured_instances()
    if instances != processes:
        raise ValueError(
            f"This process is one of {processes} (its MPI launcher's), but the configured "
            f"IPU system's replicas all-reduce over {instances} process(es), so each process "
            "would train its own model under the keras.distribution. Configure every "
            "process with keras_ipu.popdist.tensorflow.set_ipu_config(IPUConfig()) and "
            "configure_ipu_system() before making the model (launch with "
            "python -m keras_ipu.poprun)."
        )
    return instances


def _check_ipu_order(mesh, indices, batch, model_axis):
    """Replica r runs on the IPUs r*k .. r*k + k - 1 (the device's IPUs in
    order, as Graphcore's replication lays out multi-IPU replicas): the
    mesh must name them so, batch axis before the model axis."""
    if model_axis is None:
        return
    import numpy as np

    names = list(mesh.axis_names)
    order = [names.index(a) for a in (batch, model_axis) if a in names]
    order += [i for i in range(len(names)) if i not in order]
    laid = np.transpose(indices, order).reshape(-1)
    if list(laid) != list(range(laid.size)):
        raise ValueError(
            f"The DeviceMesh {dict(zip(names, mesh.shape))} puts its IPUs "
            f"{np.asarray(mesh.devices).tolist()} in an order the ipu backend cannot "
            f"run: replica r of the '{batch}' axis runs on the consecutive IPUs "
            f"r*k .. r*k+k-1 of its '{model_axis}' axis (k IPUs). Make the mesh from "
            "keras.distribution.list_devices() in order, with the batch axis first, "
            f"e.g. DeviceMesh(({mesh.shape[names.index(batch)] if batch in names else 1}, "
            f"k), ['{batch}', '{model_axis}'], keras.distribution.list_devices()).")


def _is_tf_dataset(x):
    return type(x).__module__.startswith("tensorflow.") and hasattr(x, "rebatch")


def _per_replica(size, replicas, what):
    size = int(size)
    if size % replicas:
        raise ValueError(
            f"The global {what} {size} cannot be split over {replicas} replicas: "
            f"keras.distribution splits each batch evenly, so use a multiple of "
            f"{replicas} (e.g. {replicas * max(1, size // replicas)})."
        )
    return size // replicas


def _rebatched(dataset, replicas):
    """A batched tf.data.Dataset of global batches, as batches of one
    replica's share (consecutive slices, in order)."""
    from tensorflow.python.data.experimental.ops import distribute as tf_data_distribute

    size = int(tf_data_distribute.compute_batch_size(dataset).numpy())
    if size < 0:
        raise ValueError(
            "The batch size of the input dataset is unknown: batch it with "
            "dataset.batch(global_batch_size) so the ipu backend can split each batch "
            "over the replicas."
        )
    import tensorflow as tf

    rebatched = dataset.rebatch(_per_replica(size, replicas, "batch size of the dataset"))
    # rebatch forgets the cardinality; the infeed needs it to count steps.
    count = int(dataset.cardinality().numpy())
    if count >= 0:
        rebatched = rebatched.apply(tf.data.experimental.assert_cardinality(count * replicas))
    return rebatched
