"""IPUStrategyV1: Graphcore's distribution strategy for a system of IPUs.

    strategy = ipu.ipu_strategy.IPUStrategy()
    with strategy.scope():
        model = keras.Model(...)       # gets the IPU extensions
        model.fit(...)                 # one program per execution, replicated
        out = strategy.run(step, args=(x,))

As Graphcore's: the scope marks Keras models made in it (they get the IPU
extensions: gradient accumulation, pipelining, replication options) and
the device they run on (`ipu_device`); `run` compiles a function into one
program for that device; the device's IPUs replicate a one-shard program
inside the program itself, so TensorFlow's view of replication stays one
replica (`num_replicas_in_sync` is 1, as on Graphcore's IPUStrategy).

`run` of a TensorFlow function (tf.function) goes to the TensorFlow front
end (keras_ipu/frontends/tensorflow/strategy_run.py, `run(strategy, fn,
args, kwargs)`), which compiles it through TensorFlow's XLA bridge: one
strategy object for both backends.
"""

import enum
import warnings

import numpy as np

from keras_ipu.distribute import scope as _scope
from keras_ipu.distribute.values import PerReplica
from keras_ipu.distribute.values import ValueContext


class ReduceOp(enum.Enum):
    """tf.distribute.ReduceOp's two members (TensorFlow's own are accepted
    too, by name)."""

    SUM = "SUM"
    MEAN = "MEAN"


def _reduce_op(op):
    name = getattr(op, "value", op)
    name = getattr(op, "name", name) if not isinstance(name, str) else name
    if isinstance(name, str) and name.upper() in ("SUM", "MEAN"):
        return ReduceOp[name.upper()]
    raise ValueError(f"Unsupported reduce op: {op}")


class _Extended:
    """strategy.extended: the device queries Graphcore's Keras code makes."""

    def __init__(self, strategy):
        self._strategy = strategy

    def non_slot_devices(self, var_list):
        del var_list
        return self._strategy._ipu_device

    @property
    def worker_devices(self):
        return (self._strategy._ipu_device,)

    @property
    def parameter_devices(self):
        return (self._strategy._ipu_device,)


class InputContext:
    """What distribute_datasets_from_function tells dataset_fn: one input
    pipeline feeds every replica of the device (the IPU's infeed)."""

    num_input_pipelines = 1
    input_pipeline_id = 0
    num_replicas_in_sync = 1

    def get_per_replica_batch_size(self, global_batch_size):
        return global_batch_size


class DistributedDataset:
    """A dataset seen through the strategy: iterating gives its elements as
    NumPy structures; on a device of several replicas each element is a
    structure of PerReplica values, one dataset element per replica (as
    each replica of an IPU program dequeues its own element of the infeed),
    ready for `strategy.run`."""

    def __init__(self, dataset, strategy):
        self._dataset = dataset
        self._strategy = strategy

    def __iter__(self):
        from keras.src import tree

        replicas = self._strategy._replication_factor()
        it = iter(self._dataset)
        while True:
            elements = []
            try:
                for _ in range(replicas):
                    elements.append(tree.map_structure(_to_numpy, next(it)))
            except StopIteration:
                return  # an incomplete group of replicas is dropped
            if replicas == 1:
                yield elements[0]
            else:
                yield tree.map_structure(lambda *xs: PerReplica(xs), *elements)


def _to_numpy(x):
    if hasattr(x, "numpy") and not isinstance(x, np.ndarray):
        return np.asarray(x.numpy())
    return x


def _is_tensorflow_function(fn):
    return type(fn).__module__.startswith("tensorflow.")


def _keras_backend():
    from keras.src.backend import backend

    return backend()


class IPUStrategyV1:
    """A distribution strategy for a system with one or more IPUs (see the
    module doc). Arguments as Graphcore's: `ipu_device` names the device of
    the configured system the models and functions run on;
    `enable_keras_extensions=False` leaves Keras models made in the scope
    as they are."""

    # IPUs one replica spans besides its pipeline stages: a keras.distribution
    # model axis (tensor parallelism, keras_distribution.py); 1 here.
    model_axis_ipus = 1

    def compile_options(self, variables, options):
        """The CompileOptions of a program whose first inputs are the model's
        `variables`: `options` as they are (keras_distribution.py splits them)."""
        del variables
        return options

    def __init__(
        self,
        ipu_device="/device:IPU:0",
        cpu_device="/device:CPU:0",
        enable_dataset_iterators=True,
        enable_keras_extensions=True,
    ):
        self._ipu_device = ipu_device
        self._cpu_device = cpu_device
        self._enable_dataset_iterators = enable_dataset_iterators
        self._enable_keras_extensions = enable_keras_extensions
        self._runs = {}
        self.extended = _Extended(self)

    def __repr__(self):
        return f"<IPUStrategyV1 on {self._ipu_device}>"

    # -- scope ----------------------------------------------------------
    def scope(self):
        """Models (and variables) created inside belong to this strategy."""
        return _scope.strategy_scope(self)

    def _patch_keras_extension(self, model):
        if not self._enable_keras_extensions:
            return
        from keras_ipu.models import extension

        extension.attach(model, self)

    def _model_data_arguments(self, model, mode, kwargs):
        """The data arguments of a model's fit/evaluate/predict (`mode`) as
        the IPU's infeed takes them: a batch is one replica's here
        (keras_distribution.py overrides this: Keras' batch is global)."""
        del model, mode
        return kwargs

    # -- the device -------------------------------------------------------
    @property
    def num_replicas_in_sync(self):
        """1, as Graphcore's IPUStrategy reports: the IPUs replicate the
        program inside it; each Keras batch is one replica's."""
        return 1

    @property
    def supports_loss_scaling(self):
        return True

    def _device(self):
        from keras_ipu.device.config import system_config

        return system_config.current_system().device(self._ipu_device)

    def _replication_factor(self, num_shards=1):
        """Replicas of a `num_shards`-IPU program on the strategy's device."""
        return self._device().replication_factor(num_shards)

    # -- running functions ------------------------------------------------
    def run(self, fn, args=(), kwargs=None, options=None):
        """Compile `fn(*args, **kwargs)` into one program for the device and
        run it on every replica (keras_ipu/distribute/run.py); returns
        replica 0's results."""
        del options
        kwargs = dict(kwargs or {})
        if _is_tensorflow_function(fn) or _keras_backend() == "tensorflow":
            return self._run_tensorflow(fn, args, kwargs)
        from keras_ipu.distribute import run as _run

        if _run.inside_trace():
            return _run.run_inline(fn, args, kwargs)
        program = self._runs.get(fn)
        if program is None:
            program = self._runs[fn] = _run.StrategyRun(fn)
        with self.scope():
            return program(tuple(args), kwargs, self._replication_factor())

    def _run_tensorflow(self, fn, args, kwargs):
        try:
            from keras_ipu.frontends.tensorflow import strategy_run
        except ImportError as e:
            raise NotImplementedError(
                "IPUStrategy.run of a TensorFlow function (or under "
                "KERAS_BACKEND=tensorflow) compiles it through the TensorFlow "
                "front end (keras_ipu.frontends.tensorflow), which is not "
                f"available in this installation ({e}). Under KERAS_BACKEND=ipu, "
                "pass a plain Python function of Keras code instead."
            ) from e
        with self.scope():
            return strategy_run.run(self, fn, args, kwargs)

    def experimental_run_v2(self, fn, args=(), kwargs=None):
        """The SDK 2.1 name of `run` (deleted in later SDKs, which raise):
        kept, with a DeprecationWarning, so SDK 2.1 scripts run."""
        warnings.warn(
            "`experimental_run_v2` has been deleted in later Poplar SDKs. "
            "Use `run` instead.",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.run(fn, args, kwargs)

    def reduce(self, reduce_op, value, axis=None):
        """`reduce_op` (SUM or MEAN) of `value` over `axis` and over the
        replicas. In a replicated program (inside `run`'s function) the
        replicas all-reduce; on the host a value is already one replica's
        and only `axis` is reduced, as Graphcore's IPUStrategy does."""
        from keras.src import tree

        op = _reduce_op(reduce_op)
        from keras_ipu.distribute import run as _run

        if _run.inside_trace():
            from keras import ops

            from keras_ipu.distribute import cross_replica

            def device(x):
                if axis is not None:
                    x = (ops.sum if op is ReduceOp.SUM else ops.mean)(x, axis=axis)
                if op is ReduceOp.SUM:
                    return cross_replica.cross_replica_sum(x)
                return cross_replica.cross_replica_mean(x)

            return tree.map_structure(device, value)

        def host(x):
            if isinstance(x, PerReplica):
                xs = [np.asarray(_to_numpy(v)) for v in x.values]
                if axis is not None:
                    xs = [(np.sum if op is ReduceOp.SUM else np.mean)(v, axis=axis) for v in xs]
                total = np.sum(xs, axis=0)
                return total if op is ReduceOp.SUM else total / len(xs)
            x = np.asarray(_to_numpy(x))
            if axis is None:
                return x
            return (np.sum if op is ReduceOp.SUM else np.mean)(x, axis=axis)

        return tree.map_structure(host, value)

    # -- data -------------------------------------------------------------
    def experimental_distribute_dataset(self, dataset, options=None):
        del options
        return DistributedDataset(dataset, self)

    def distribute_datasets_from_function(self, dataset_fn, options=None):
        del options
        return DistributedDataset(dataset_fn(InputContext()), self)

    experimental_distribute_datasets_from_function = distribute_datasets_from_function

    def experimental_distribute_values_from_function(self, value_fn):
        """PerReplica(value_fn(ValueContext(r, n)) for each replica r of the
        device): arguments of `run` that differ between replicas."""
        n = self._replication_factor()
        values = [value_fn(ValueContext(r, n)) for r in range(n)]
        return values[0] if n == 1 else PerReplica(values)


IPUStrategy = IPUStrategyV1
