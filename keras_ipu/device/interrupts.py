"""Ctrl-C never leaves a model half updated.

An execution updates the model's state in place (donation: the compiled
loop writes each step's new weights and optimizer slots into the old
arrays), and then stores the results in the Keras variables. A
KeyboardInterrupt landing in between would leave some variables at one
step and some at another (kernels at step 12, biases and
`optimizer.iterations` at step 10), a model that then trains and saves
without complaint. The IPU itself cannot be stopped inside a device loop
either: Graphcore's runtime finishes the loop it started.

The same holds wherever a program's results are written back into
variables: IPUStrategy.run of Keras code (distribute/run.py) and
TensorFlow functions run through the front end (frontends/tensorflow/
function.py), where one run updates several variables.

So while an execution runs and its state is stored, SIGINT is only
recorded; the interrupt is raised (by the handler that was there before)
as soon as the state is complete. Every variable and
`optimizer.iterations` are then at the last completed execution.
"""

import contextlib
import signal
import sys
import threading

_active = False


@contextlib.contextmanager
def deferred_interrupts(what="the running execution"):
    """Within: SIGINT is recorded, not raised; on leaving, the previous
    handler gets it (Python's default raises KeyboardInterrupt).

    Only the main thread receives signals, so elsewhere (and when nested,
    or when SIGINT is ignored or left to the OS) this does nothing.
    """
    global _active
    if _active or threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGINT)
    if not callable(previous):  # SIG_IGN, SIG_DFL, or set outside Python
        yield
        return
    received = []

    def record(signum, frame):
        received.append((signum, frame))
        if len(received) == 1:
            sys.stderr.write(
                f"\nInterrupted: finishing {what} so that every variable "
                "stays at the same step; the interrupt follows when its "
                "state is stored.\n"
            )
            sys.stderr.flush()

    signal.signal(signal.SIGINT, record)
    _active = True
    try:
        yield
    finally:
        _active = False
        signal.signal(signal.SIGINT, previous)
        if received:
            previous(*received[0])
