"""`IPUStrategy.run(fn, args, kwargs)` for TensorFlow code: `fn` (a
tf.function, or a Python function of TensorFlow ops) compiled through XLA
and run as one program on the strategy's simulated IPU.

A tf.data iterator among the arguments is streamed through an infeed (an
`IPUOwnedIterator` over it, one per iterator, so the same program serves
every call): `next(iterator)` inside the function reads the next element
when the program gets there, as Graphcore's IPUStrategy does with dataset
iterators.

On a device of several replicas (the strategy's replication factor) the
function runs on each (SPMD): every replica dequeues its own elements of
the infeeds (element i goes to replica i mod n), an outfeed returns a
replica axis after the enqueue axis, collectives (XLA all-reduce) meet
across replicas, and the outputs and variables are replica 0's. The
function is traced in a TensorFlow replica context (replica_context.py),
so Keras' optimizer sums the gradients over the replicas as on Graphcore's
IPUStrategy.

Replicas, as Graphcore's compiler counts them: the device's IPUs over the
IPUs one replica spans, its highest IPU + 1 rounded up to a power of two
(system.rounded_shards), so a 2-stage functional pipeline (or a program
sharded over 2 IPUs) runs 2 replicas on 4 IPUs, and a device whose IPUs
that does not divide refuses it with the compiler's message. The shards
are known once the function is traced: the first call traces it for a
one-shard program (a replica per IPU: most programs, which then need
nothing more) and, when the imported program spans more IPUs, traces it
again for its own replica count (the replica context's reductions are
traced for a number of replicas; TensorFlow keeps one trace per
tf.function, so that trace is a copy's). Each later call on the same
configuration goes straight to the program of its replica count.
"""

import weakref

from keras_ipu.frontends.tensorflow.replica_context import replica_context

_owned = weakref.WeakKeyDictionary()


def _is_data_iterator(x):
    from tensorflow.python.data.ops import iterator_ops

    return isinstance(x, iterator_ops.OwnedIterator)


def _infeed_of(iterator):
    from keras_ipu.ipu_infeed_queue import IPUOwnedIterator

    found = _owned.get(iterator)
    if found is None:
        found = IPUOwnedIterator(iterator)
        _owned[iterator] = found
    return found


def _substitute(value):
    if _is_data_iterator(value):
        return _infeed_of(value)
    if isinstance(value, list):
        return [_substitute(v) for v in value]
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(_substitute(v) for v in value)
    if isinstance(value, dict):
        return {k: _substitute(v) for k, v in value.items()}
    return value


class _Replicated:
    """`fn`'s bridged functions by replica count, and the replica count its
    program takes on each device (see the module doc). `shared`: bridge(fn),
    which traces it for the probe's count (a replica per IPU)."""

    def __init__(self, fn, shared):
        self.fn = fn
        self.shared = shared
        self.by_replicas = {}
        self.known = {}  # device name -> (the configuration, its replicas there)

    def bridged(self, replicas, probe):
        """The BridgedFunction tracing `fn` for `replicas` replicas."""
        from keras_ipu.frontends.tensorflow.function import BridgedFunction

        if replicas == probe:
            return self.shared
        found = self.by_replicas.get(replicas)
        if found is None:
            fn = self.fn
            clone = getattr(fn, "_clone", None)  # a tf.function: its own traces
            found = self.by_replicas[replicas] = BridgedFunction(
                clone(None) if clone is not None else fn)
        return found


def _replicated_of(fn):
    """The _Replicated of `fn`, kept with its shared BridgedFunction (one
    per function object, as bridge keeps those)."""
    from keras_ipu.frontends.tensorflow.function import bridge

    shared = bridge(fn)
    found = getattr(shared, "strategy_replicas", None)
    if found is None:
        found = shared.strategy_replicas = _Replicated(fn, shared)
    return found


def program_shards(program):
    """IPUs one replica of an imported (not yet compiled) program spans: its
    highest IPU + 1, rounded up to a power of two (1 unless placed)."""
    from keras_ipu.device.compiler.placement import Placement
    from keras_ipu.device.compiler.placement import recorded_stages
    from keras_ipu.device.simulator.system import rounded_shards

    placement = program.placement
    stages = recorded_stages(program.graph) if placement is not None else ()
    if not stages:
        return 1
    ipu_of = Placement.of({}, placement.device_mapping).ipu_of
    return rounded_shards(max(ipu_of(s) for s in stages) + 1)


def run(strategy, fn, args=(), kwargs=None):
    """Run `fn(*args, **kwargs)` on `strategy`'s IPU (see the module doc)."""
    from keras_ipu.device.config import system_config

    args = _substitute(list(args or ()))
    kwargs = _substitute(dict(kwargs or {}))
    in_sync = getattr(strategy, "num_replicas_in_sync", 1)
    device = strategy._device()  # noqa: SLF001
    replicated = _replicated_of(fn)
    probe = device.replication_factor(1)
    configuration = system_config.configuration()
    known, replicas = replicated.known.get(strategy._ipu_device, (None, None))  # noqa: SLF001
    if known is not configuration:
        with replica_context(probe, in_sync):
            program = replicated.bridged(probe, probe).program(args, kwargs, probe)[3]
        replicas = device.replication_factor(program_shards(program))
        replicated.known[strategy._ipu_device] = (configuration, replicas)  # noqa: SLF001
    with replica_context(replicas, in_sync):  # traced in it: the replicas' reductions
        return replicated.bridged(replicas, probe).run(args, kwargs, replicas=replicas)
