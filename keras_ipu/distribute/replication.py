"""How many replicas the program being traced runs on.

A replicated program is one replica's program (simulator/replicas.py):
the code that traces it (IPUStrategy.run, a model's fit/evaluate/predict)
says here how many replicas will run it, and the cross-replica operations
traced meanwhile (cross_replica.py, synchronised BatchNormalization, the
all-reduce of gradients) are compiled for that many.
"""

import contextlib
import contextvars

_replicas = contextvars.ContextVar("keras_ipu_traced_replicas", default=1)


@contextlib.contextmanager
def tracing_replicas(n):
    """Within: programs traced run on `n` replicas."""
    token = _replicas.set(int(n))
    try:
        yield
    finally:
        _replicas.reset(token)


def replicas_in_trace():
    """The replication factor of the program being traced (1 outside)."""
    return _replicas.get()
