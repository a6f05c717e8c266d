"""A stack per thread: what is in scope now on this thread (the running
trace, the pipeline stage of the nodes being recorded, the IPUStrategy).

Scopes nest (a trace inside a trace, a strategy scope entered twice) and
each thread has its own (replicas run in threads and trace in parallel), so
each of those is a stack in a threading.local; this is that stack, once.
"""

import contextlib
import threading


class ThreadStack:
    def __init__(self):
        self._local = threading.local()

    def _stack(self):
        stack = getattr(self._local, "stack", None)
        if stack is None:
            stack = self._local.stack = []
        return stack

    def top(self):
        """The innermost value pushed on the calling thread, or None."""
        stack = getattr(self._local, "stack", None)
        return stack[-1] if stack else None

    @contextlib.contextmanager
    def pushed(self, value):
        """`value` is on top of the calling thread's stack inside."""
        stack = self._stack()
        stack.append(value)
        try:
            yield value
        finally:
            stack.pop()
