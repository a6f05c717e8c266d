"""Data streams between the host and the IPU: the other end of the
stream primitives (device/primitives/host_transfer.py).

On the IPU a program reads an infeed and writes an outfeed through data
streams whose host side is a callback Poplar calls when the device gets
there. Here the same: a stream is any object with
  `receive(component, shape, dtype) -> ndarray`  (host -> IPU: the next value)
  `send(component, value)`                      (IPU -> host)
registered under an integer id that the stream primitives carry as a
param; their kernels call it when the simulator runs the program.
"""

import contextlib
import itertools
import threading
import weakref

_streams = weakref.WeakValueDictionary()
_ids = itertools.count(1)
_lock = threading.Lock()
_bound = threading.local()  # .streams: the ids bound() gives this thread


class StreamClosedError(RuntimeError):
    pass


def register(stream):
    """A new id for `stream` (kept only as long as the stream lives)."""
    with _lock:
        sid = next(_ids)
        _streams[sid] = stream
    return sid


@contextlib.contextmanager
def bound(streams):
    """In this thread, the ids of `streams` (id -> stream) name those
    streams: a program loaded from a file (ops/embedded_runtime.py) meets
    its host side under the ids it was compiled with."""
    previous = getattr(_bound, "streams", None)
    _bound.streams = {**(previous or {}), **streams}
    try:
        yield
    finally:
        _bound.streams = previous


def get(stream_id):
    local = getattr(_bound, "streams", None)
    if local and stream_id in local:
        return local[stream_id]
    stream = _streams.get(stream_id)
    if stream is None:
        raise StreamClosedError(
            f"Host data stream {stream_id} no longer exists: the infeed or "
            "outfeed queue a compiled program reads or writes was deleted. "
            "Keep the queue alive while programs that use it run."
        )
    return stream
