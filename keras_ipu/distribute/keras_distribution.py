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

The backend side (devices, processes, layouts) is
keras_ipu/backend/distribution_lib.py; layouts that split a weight across
IPUs raise NotImplementedError there.
"""

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
        backend_dlib._to_backend_mesh(mesh)  # every device an IPU we have
        batch = distribution.batch_dim_name
        others = {a: n for a, n in backend_dlib.mesh_axis_sizes(mesh).items()
                  if a != batch and n > 1}
        if others:
            raise NotImplementedError(
                f"{type(distribution).__name__} over the mesh {dict(zip(mesh.axis_names, mesh.shape))} "
                f"splits the model over the axes {others}: " + backend_dlib.SHARDED_TENSOR_REASON
            )
        super().__init__()
        self._distribution = distribution

    def __repr__(self):
        return f"<KerasDistributionStrategy {self._distribution!r} on {self._ipu_device}>"

    def _patch_keras_extension(self, model):
        super()._patch_keras_extension(model)
        # Keras' metrics under a distribution are the global batch's: the
        # mean of the replicas' (equal batches), not one replica's, which is
        # what IPUStrategy reports by default (Graphcore's NONE).
        model.set_replication_options(replicated_metric_reduction_method="MEAN")

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
        for variable in model.variables:
            backend_dlib.check_layout(
                self._distribution.get_variable_layout(variable),
                f"The variable {variable.path!r}", None)


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
