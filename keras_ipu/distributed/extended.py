"""`strategy.extended` of the multi-process strategies, and the reference's
variable classes.

Graphcore's strategies are TensorFlow StrategyV1 objects whose `extended`
(PopDistExtendedV1, IPUMultiWorkerExtended, IPUHorovodExtended) creates
every variable as a mirrored variable and reads the aggregate of a
sync-on-read one (`read_var`). Here the strategy's `extended` is the
device queries of IPUStrategy (distribute/strategy.py) plus `read_var`
over the instances of the job; the constructors take the reference's
arguments and refuse those keras_ipu does not support.

keras_ipu creates no per-replica variable objects: the replicas of an
instance share one copy of each variable (kept equal by the all-reduced
updates) and the instances start from instance 0's state (broadcast), so
IPUMirroredVariable and IPUSyncOnReadVariable are not provided.
"""

from keras_ipu._unavailable import unavailable_class
from keras_ipu.distribute.strategy import _Extended

_NO_VARIABLE_WRAPPERS = (
    "keras_ipu creates no per-replica variable objects: the replicas of an "
    "instance share one copy of each variable, the all-reduced updates keep "
    "it equal and instance 0's values are broadcast at the start, so Keras and "
    "TensorFlow variables are used as they are; read the aggregate of a "
    "sync-on-read variable with strategy.extended.read_var(variable)."
)

IPUMirroredVariable = unavailable_class(
    "ipu_multi_worker_strategy.IPUMirroredVariable", _NO_VARIABLE_WRAPPERS
)
IPUSyncOnReadVariable = unavailable_class(
    "ipu_multi_worker_strategy.IPUSyncOnReadVariable", _NO_VARIABLE_WRAPPERS
)


def _name(setting):
    """'on_read', 'sum', ... from a Keras string or a tf.Variable* enum."""
    if setting is None:
        return "none"
    return str(getattr(setting, "name", setting)).lower()


def _value(var):
    if hasattr(var, "read_value") and type(var).__module__.startswith("tensorflow"):
        return var.read_value()
    return getattr(var, "value", var)


class IPUMultiWorkerExtended(_Extended):
    """`IPUMultiWorkerStrategy(...).extended`: the IPU device queries and
    `read_var`. `variables_on_host=True` is not supported."""

    def __init__(self, container_strategy, cluster_resolver, ipu_device, variables_on_host):
        if variables_on_host:
            raise NotImplementedError(
                "variables_on_host=True is not supported: the weights and their update "
                "stay on the IPU (leave variables_on_host at False)."
            )
        super().__init__(container_strategy)
        self._cluster_resolver = cluster_resolver
        self._ipu_device = ipu_device
        self._variables_on_host = False

    def read_var(self, var):
        """Read the aggregate value of a replica-local variable.

        A sync-on-read variable (`synchronization="on_read"`, as Keras'
        metric variables are) holds this instance's part: it is reduced over
        the instances by its `aggregation` ("sum", "mean", or
        "only_first_replica": instance 0's), so every instance must read it
        at the same time, as on Graphcore's strategies. Any other variable
        is the same on every instance and is read as it is.
        """
        from keras_ipu.distributed import host_collectives
        from keras_ipu.distributed import mpi_world

        if _name(getattr(var, "synchronization", None)) != "on_read":
            return _value(var)
        aggregation = _name(getattr(var, "aggregation", None))
        if aggregation not in ("sum", "mean", "only_first_replica"):
            raise ValueError(
                f"read_var of the sync-on-read variable {getattr(var, 'name', var)!r}: its "
                f"aggregation is {aggregation!r}, so there is no aggregate to read; "
                "create it with aggregation 'sum', 'mean' or 'only_first_replica'."
            )
        if mpi_world.world().size == 1:
            return _value(var)
        if aggregation == "only_first_replica":
            return host_collectives.broadcast(_value(var), 0, name="read_var")
        op = host_collectives.Sum if aggregation == "sum" else host_collectives.Average
        return host_collectives.allreduce(_value(var), op=op)


class IPUHorovodExtended(IPUMultiWorkerExtended):
    """`IPUHorovodStrategy().extended` (the same arguments as the
    multi-worker one; the cluster is the MPI job)."""


class PopDistExtendedV1(IPUMultiWorkerExtended):
    """`PopDistStrategy().extended`. `add_ipu_cross_replica_reductions=False`
    is not supported."""

    def __init__(
        self, container_strategy, cluster_resolver, ipu_device, add_ipu_cross_replica_reductions
    ):
        if not add_ipu_cross_replica_reductions:
            raise NotImplementedError(
                "PopDistStrategy(add_ipu_cross_replica_reductions=False) is not "
                "supported: the compiled all-reduces always cover every replica of "
                "the job (leave the argument at True)."
            )
        super().__init__(container_strategy, cluster_resolver, ipu_device, variables_on_host=False)
        self._add_ipu_cross_replica_reductions = True
