"""PopDistStrategy: IPUStrategy with the replicas spread over MPI processes.

    config = keras_ipu.popdist.tensorflow.set_ipu_config(ipu.config.IPUConfig())
    config.configure_ipu_system()
    strategy = PopDistStrategy()
    with strategy.scope():
        model = keras.Model(...)
        model.fit(dataset_shard_of_this_instance, ...)

As Graphcore's: the program of each instance is the replicated program of
IPUStrategy (distribute/strategy.py), and its all-reduces cover every
replica of every instance (multi_replica_distribution in the configured
system: the compiled collective adds the instances' partial sums over MPI,
simulator/replicas.py), so `fit` trains with the gradients averaged over
all `popdist.getNumTotalReplicas()` replicas. Around that:

- the model's state (weights, optimizer slots, iterations) is broadcast
  from instance 0 when each fit / evaluate / predict starts (Graphcore
  broadcasts the initial values of variables with Horovod);
- `num_replicas_in_sync` is the job's replica count, and `reduce` on the
  host reduces over the instances too (Horovod's allreduce);
- only instance 0 runs checkpoint, TensorBoard and CSV callbacks
  (distributed/callbacks.py);
- logs: the replicas of an instance are reduced as set_replication_options
  says (Graphcore's outfeed is per instance); with SUM or MEAN the
  instances' results are then reduced too, so every instance reports the
  job's value.
"""

import functools
import inspect
import weakref

import numpy as np

from keras_ipu.distribute.strategy import IPUStrategyV1
from keras_ipu.distribute.strategy import ReduceOp
from keras_ipu.distribute.strategy import _reduce_op
from keras_ipu.distributed import callbacks as _callbacks
from keras_ipu.distributed import mpi_world
from keras_ipu.distributed.extended import IPUMirroredVariable  # noqa: F401
from keras_ipu.distributed.extended import IPUSyncOnReadVariable  # noqa: F401
from keras_ipu.distributed.extended import PopDistExtendedV1
from keras_ipu.models.execution import _REPLICA_SEED_STRIDE
from keras_ipu.models.execution import _identical_replica_seeds
from keras_ipu.models.execution import _is_seed_state


class PopDistStrategy(IPUStrategyV1):
    """Replicas over every process of a poprun (MPI) job (see the module doc).

    `add_ipu_cross_replica_reductions=False` leaves the reductions on the
    IPU local to each instance, as Graphcore's argument does.
    """

    _instance_sync = True

    def __init__(
        self,
        ipu_device="/device:IPU:0",
        add_ipu_cross_replica_reductions=True,
        enable_dataset_iterators=True,
        enable_keras_extensions=True,
    ):
        from keras_ipu import popdist

        extended = PopDistExtendedV1(self, None, ipu_device, add_ipu_cross_replica_reductions)
        popdist.init()
        super().__init__(
            ipu_device=ipu_device,
            enable_dataset_iterators=enable_dataset_iterators,
            enable_keras_extensions=enable_keras_extensions,
        )
        self.extended = extended
        self._world = mpi_world.world()
        self._new_models = []  # weak references, in creation order

    def __repr__(self):
        return f"<{type(self).__name__} on {self._ipu_device}, instance {self._world.rank} of {self._world.size}>"

    def update_ipu_config(self, config):
        """Set `config`'s multi_replica_distribution to this job; returns it."""
        from keras_ipu import popdist

        mrd = config.experimental.multi_replica_distribution
        mrd.process_count = popdist.getNumInstances()
        mrd.process_index = popdist.getInstanceIndex()
        return config

    @property
    def num_replicas_in_sync(self):
        """Every replica of every instance."""
        return self._replication_factor() * self._world.size

    def reduce(self, reduce_op, value, axis=None):
        """As IPUStrategy's, and on the host over the instances too."""
        from keras_ipu.distribute import run as _run

        local = super().reduce(reduce_op, value, axis)
        if _run.inside_trace():
            return local
        from keras.src import tree

        op = _reduce_op(reduce_op)
        size = self._world.size

        def over_instances(x):
            total = mpi_world.sum_over_instances(np.asarray(x), "strategy.reduce")
            return total if op is ReduceOp.SUM else total / size

        return tree.map_structure(over_instances, local)

    def run(self, fn, args=(), kwargs=None, options=None):
        """As IPUStrategy's (Keras code, or TensorFlow code through the
        TensorFlow front end); models made in the scope first get instance
        0's state, as Graphcore broadcasts the initial values of variables
        (a custom training loop has no fit to do it)."""
        from keras_ipu.distribute import run as _run

        if _run.inside_trace():
            return super().run(fn, args, kwargs, options)
        unbuilt = self._broadcast_new_models()
        result = super().run(fn, args, kwargs, options)
        built = [m for m in unbuilt if m.variables]
        if built:
            raise ValueError(
                f"The model {built[0].name!r} made in the PopDistStrategy scope was built "
                "inside strategy.run, so instance 0's initial weights could not be "
                "broadcast to the other instances before its first step (each instance "
                "trained from its own random weights). Build it before the first "
                "strategy.run: give it a keras.Input, or call model.build(input_shape)."
            )
        return result

    def _broadcast_new_models(self):
        """Broadcast the state of the built models made in the scope since
        the last run (in creation order: the same on every instance);
        returns the models not built yet."""
        pending = [m for m in (ref() for ref in self._new_models) if m is not None]
        unbuilt = [m for m in pending if not m.variables]
        for model in pending:
            if model.variables:
                broadcast_state(model)
        self._new_models = [weakref.ref(m) for m in unbuilt]
        return unbuilt

    # -- models ---------------------------------------------------------------
    def _patch_keras_extension(self, model):
        self._new_models.append(weakref.ref(model))
        super()._patch_keras_extension(model)
        synchronise_instances(model)


def synchronise_instances(model):
    """Make `model` do around each fit / evaluate / predict what a model of
    a multi-process strategy does (the module doc): start from instance 0's
    state, reduce its logs over the instances, run the checkpoint and
    logging callbacks on instance 0 only."""
    if not getattr(type(model), "_keras_ipu_instance_sync", False):
        model.__class__ = _synchronised_class(type(model))


def broadcast_state(model, root=0):
    """Give every instance instance `root`'s model and optimizer state (one
    MPI broadcast per dtype); random seed states are then moved to each
    instance's first replica, so that no two replicas of the job draw the
    same numbers (unless reset_ipu_seed(..., experimental_identical_replicas=True))."""
    from keras_ipu import popdist

    offset = popdist.getReplicaIndexOffset()
    strategy = getattr(model, "_ipu_strategy", None)
    identical_seeds = strategy is not None and _identical_replica_seeds(strategy)
    variables = list(model.variables)
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None and getattr(optimizer, "built", False):
        known = {id(v) for v in variables}
        variables += [v for v in optimizer.variables if id(v) not in known]
    world = mpi_world.world()
    by_dtype = {}
    for v in variables:
        by_dtype.setdefault(np.dtype(v.dtype).str, []).append(v)
    for dtype in sorted(by_dtype):
        group = by_dtype[dtype]
        flat = np.concatenate([np.asarray(v.value).reshape(-1) for v in group]) if group else None
        if flat is None or flat.size == 0:
            continue
        received = world.broadcast(flat, root, f"broadcast of the model state ({dtype})")
        at = 0
        for v in group:
            size = int(np.prod(v.shape))
            value = received[at : at + size].reshape(v.shape)
            if _is_seed_state(v) and not identical_seeds:
                value = _seed_of_replica(value, offset)
            v.assign(value)
            at += size


def _seed_of_replica(seed_state, replica):
    """A seed generator's state for global replica `replica` (replicas of
    one process differ the same way, models/execution.py)."""
    value = np.array(seed_state)
    value.reshape(-1)[0] = (int(value.reshape(-1)[0]) + replica * _REPLICA_SEED_STRIDE) % 2**32
    return value


def _callbacks_argument(method, args, kwargs):
    """(args, kwargs) with the `callbacks` argument kept for this instance."""
    signature = inspect.signature(method)
    bound = signature.bind_partial(*args, **kwargs)
    if "callbacks" in bound.arguments:
        rank = mpi_world.world().rank
        bound.arguments["callbacks"] = _callbacks.for_instance(bound.arguments["callbacks"], rank)
    return bound.args, bound.kwargs


def reduce_logs_over_instances(model, logs):
    """With set_replication_options' SUM or MEAN, the logs of this instance's
    replicas reduced over the instances too (NONE and LIST stay local)."""
    from keras.src import tree

    from keras_ipu.models.options import ReplicatedMetricReductionMethod as Reduction

    method = model._ipu_options.replicated_metric_reduction_method
    if method not in (Reduction.SUM, Reduction.MEAN):
        return logs
    size = mpi_world.world().size

    def reduce(x):
        if x is None:
            return None
        total = mpi_world.sum_over_instances(np.asarray(x, dtype=np.float64), "reduction of the logs")
        return total if method == Reduction.SUM else total / size

    reduced = tree.map_structure(reduce, logs)
    object.__setattr__(model, "_ipu_replicated_logs", reduced)
    return reduced


def _synchronising(model, fn, logs=True):
    """`fn` (a train/test/predict execution) that first brings every
    instance to instance 0's state when an API call has just started, and
    whose logs (train, test; each step's too, with asynchronous callbacks)
    are reduced over the instances."""
    if getattr(fn, "_keras_ipu_synchronising", False):
        return fn

    @functools.wraps(fn)
    def execution(*args, **kwargs):
        if model.__dict__.get("_keras_ipu_state_pending"):
            object.__setattr__(model, "_keras_ipu_state_pending", False)
            broadcast_state(model)
        result = fn(*args, **kwargs)
        if not logs:
            return result
        # Every instance runs the same steps: their reductions pair up.
        steps = kwargs.get("step_logs") or []
        steps[:] = [reduce_logs_over_instances(model, step) for step in steps]
        return reduce_logs_over_instances(model, result)

    execution._keras_ipu_synchronising = True
    return execution


class _InstanceSync:
    """What a model made in a PopDistStrategy scope does besides IPUStrategy's."""

    _keras_ipu_instance_sync = True

    def _keras_ipu_call(self, name, args, kwargs):
        method = getattr(super(), name)
        args, kwargs = _callbacks_argument(method, args, kwargs)
        object.__setattr__(self, "_keras_ipu_state_pending", True)
        return method(*args, **kwargs)

    def fit(self, *args, **kwargs):
        return self._keras_ipu_call("fit", args, kwargs)

    def evaluate(self, *args, **kwargs):
        return self._keras_ipu_call("evaluate", args, kwargs)

    def predict(self, *args, **kwargs):
        return self._keras_ipu_call("predict", args, kwargs)

    def make_train_function(self, force=False):
        self.train_function = _synchronising(self, super().make_train_function(force))
        return self.train_function

    def make_test_function(self, force=False):
        self.test_function = _synchronising(self, super().make_test_function(force))
        return self.test_function

    def make_predict_function(self, force=False):
        self.predict_function = _synchronising(
            self, super().make_predict_function(force), logs=False
        )
        return self.predict_function


@functools.lru_cache(maxsize=None)
def _synchronised_class(cls):
    return type(cls.__name__, (_InstanceSync, cls), {"__module__": cls.__module__})
