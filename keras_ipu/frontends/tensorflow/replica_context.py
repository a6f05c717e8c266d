"""TensorFlow's replica context around TensorFlow code that IPUStrategy.run
(or PopDistStrategy.run) compiles.

Graphcore's IPUStrategy is a tf.distribute strategy: the function given to
`strategy.run` is traced in a replica context of the strategy, so

- Keras' optimizer sums the gradients over the replicas
  (`tf.distribute.get_replica_context().all_reduce(SUM, grads)` in
  apply_gradients, which GCL runs on the IPUs);
- `tf.nn.compute_average_loss` divides by the global batch
  (`num_replicas_in_sync` replicas of the job);
- `tf.distribute.get_replica_context().all_reduce(...)` reduces.

keras_ipu's strategies are not tf.distribute strategies, so the TensorFlow
front end traces the function inside `replica_context(local,
num_replicas_in_sync)`: a replica context of a small tf.distribute strategy
whose reductions are XLA all-reduces over the program's `local` replicas
(the front end imports them as the cross_replica_sum primitive; in a
multi-process job its kernel adds the other instances' partial sums,
simulator/replicas.py, and a MEAN divides by every replica of the job) and
whose `num_replicas_in_sync` is the strategy's (1 for IPUStrategy, as
Graphcore's reports; the job's replicas for PopDistStrategy). With one
replica in the whole job nothing is added to the program. Everything else
(variable updates, scopes) behaves as TensorFlow's default strategy. The
function is traced once for all replicas (SPMD), so
`replica_id_in_sync_group` reads 0, as on Graphcore's IPUStrategy and
PopDistStrategy (each replica's own index is the XLA replica-id).
"""

import contextlib
import functools


def participants(local):
    """How many replicas an all-reduce over the program's `local` replicas
    reaches: the instances' too in a multi-process job."""
    from keras_ipu.device.config import system_config

    instances, _ = system_config.configured_instances()
    return local * instances


def all_reduce(reduce_op, value, local):
    """`value` (a tensor of the trace) reduced ("SUM" or "MEAN") over the
    program's `local` replicas and the other instances of the job; itself
    when that is one replica."""
    return _all_reduce(reduce_op, value, local, participants(local))


def _all_reduce(reduce_op, value, local, participants):
    import tensorflow as tf
    from tensorflow.compiler.tf2xla.ops import gen_xla_ops

    if participants == 1:
        return value
    value = tf.convert_to_tensor(value)  # IndexedSlices (sparse gradients) densified
    summed = gen_xla_ops.xla_all_reduce(value, [list(range(local))], "Add", "CrossReplica")
    if getattr(reduce_op, "name", str(reduce_op)).upper() != "MEAN":
        return summed
    if summed.dtype.is_integer:
        return summed // participants
    return summed / tf.cast(participants, summed.dtype)


@functools.lru_cache(maxsize=None)
def _strategy_class():
    import tensorflow as tf
    from tensorflow.python.distribute import distribute_lib

    class Extended(distribute_lib._DefaultDistributionExtended):  # noqa: SLF001
        """The default strategy's behaviour, with reductions over replicas."""

        def __init__(self, container_strategy, local, in_sync):
            super().__init__(container_strategy)
            self._local = local
            self._participants = participants(local)
            self._in_sync = in_sync

        def _scope(self, strategy):
            # The default strategy's scope refuses to nest in another
            # strategy; update() enters this one inside the replica context.
            return distribute_lib.StrategyExtendedV2._scope(self, strategy)

        def _create_variable(self, next_creator, **kwargs):
            kwargs.pop("colocate_with", None)
            return next_creator(**kwargs)

        @property
        def _num_replicas_in_sync(self):
            return self._in_sync

        def _reduce_to(self, reduce_op, value, destinations, options):
            del destinations, options
            return _all_reduce(reduce_op, value, self._local, self._participants)

        def _gather_to_implementation(self, value, destinations, axis, options):
            if self._participants == 1:
                return value
            raise NotImplementedError(
                "gathering values across replicas in a TensorFlow program on the IPU is "
                "not supported; use all_reduce (SUM or MEAN) instead."
            )

    class IPUReplicas(tf.distribute.Strategy):
        """The replicas of one keras_ipu program, as TensorFlow sees them."""

        def __init__(self, local, in_sync):
            super().__init__(Extended(self, local, in_sync))

    return IPUReplicas


@contextlib.contextmanager
def replica_context(local_replicas, num_replicas_in_sync=1):
    """Trace TensorFlow code inside this to give it the replica context of
    a program of `local_replicas` replicas whose strategy reports
    `num_replicas_in_sync`."""
    from tensorflow.python.distribute import distribute_lib

    strategy = _strategy_class()(int(local_replicas), int(num_replicas_in_sync))
    with distribute_lib.ReplicaContext(strategy, replica_id_in_sync_group=0):
        yield strategy
