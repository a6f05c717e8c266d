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


def run(strategy, fn, args=(), kwargs=None):
    """Run `fn(*args, **kwargs)` on `strategy`'s IPU (see the module doc)."""
    from keras_ipu.frontends.tensorflow.function import bridge

    replicas = strategy._replication_factor() if hasattr(strategy, "_replication_factor") else 1  # noqa: SLF001
    args = _substitute(list(args or ()))
    kwargs = _substitute(dict(kwargs or {}))
    in_sync = getattr(strategy, "num_replicas_in_sync", 1)
    with replica_context(replicas, in_sync):  # traced in it: the replicas' reductions
        return bridge(fn).run(args, kwargs, replicas=replicas)
