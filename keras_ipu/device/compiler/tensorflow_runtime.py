"""TensorFlow in this process, for the XLA and graph-runtime engines
(engines.py) and `auto`'s background compile (tiered_runner.py): its
import (quiet, its pools sized, its C++ libraries preloaded), the thread
that starts its runtime at normal priority, and the process's exit while
a background compile runs.

Priority: `auto`'s background compile (TensorFlow's import, XLA's trace and
compile) runs at the lowest priority (nice 19), so it takes only CPU
that training and other processes leave idle. Measured in issue 16 on
2 cores: at normal priority it overlapped about 150 training steps and
tripled their CPU time (MLP: 17-23 against 5-7 ms per step; Keras'
demo_functional: 35 against 16 on the NumPy engine alone). Threads
inherit their starter's priority and a user cannot raise it again, so
TensorFlow's runtime (the intra- and inter-op pools that run both
engines' programs) is started by a thread of normal priority
(`_start_runtime`, one eager op) when the import is done; the compile
waits for it. XLA's compile pool is not started there: XLA creates it
at its first compile, from the compiling thread, so under `auto` it
inherits the compile's nice 19. Measured in issue 16 (eighth pass): when
the starter also ran one XLA call, that pool started at normal priority
and did about three quarters of each compile's CPU (transformer: 2.5 of
3.3 s), beside the training at equal priority. A niced thread that
holds the interpreter lock starves the training thread waiting for it
(a priority inversion), so TensorFlow's C++ libraries, the longest
block of its import, are loaded first with the lock released
(library_preload.py).

The process's exit never waits for a background compile (ResNet-50's
XLA compile takes minutes): at exit, a compile still importing
TensorFlow stops at the next module it imports, one still in Python
(tracing) at the next node it emits; one inside XLA's C++ compiler
cannot be stopped, so it is left running. In both cases the process
then ends with its exit status without running the C libraries' exit
handlers: they would break under the running compile, or crash tearing
down a TensorFlow that was only partly imported (SIGSEGV; a short
script on a busy machine exits while the niced import is still going,
and an import during the exit fails anyway: "can't register atexit
after shutdown"). Python's own finalization, atexit handlers included,
runs as usual. An abandoned compile's result is never used.

Threads: XLA and TensorFlow's kernels use TensorFlow's intra-op pool, the
graph runtime also its inter-op pool. Where the user caps the host threads
(device/native/threads.py's variables: `KERAS_IPU_HOST_THREADS`,
`OPENBLAS_NUM_THREADS`, `OMP_NUM_THREADS`, `MKL_NUM_THREADS`, the smallest
set one), both pools get that size when TensorFlow is imported for us
(tensorflow_pool_sizes); with no cap set, TensorFlow's default (the cores
this process may use). The user's own `TF_NUM_INTRAOP_THREADS` /
`TF_NUM_INTEROP_THREADS`, a `tf.config.threading` size set before, or a
TensorFlow runtime already started keeps its size. Measured on TensorFlow
2.21 (benchmarks/README.md, issue 16, nineteenth pass (s19one)): with an
intra-op pool of one thread an XLA program runs on its calling thread
alone, so a cap of 1 keeps one busy thread (a pool of 2 on one core took
8-15% more CPU per step: MLP, LSTM, demo_functional); with a pool of
N >= 2 it runs on the caller and the N pool threads, N + 1 busy threads.
So a pool of N - 1 is the caller alone at N = 2: on 2 cores under load
(another process busy) it took less CPU and wall time than the pool of 2
(LSTM 16.7-17.0 against 20.6-21.0 ms per step), but idle the pool of 2
runs the step on about 1.5 cores (eighteenth pass): 2 cores keep the pool
of 2, TensorFlow's default there.
"""

import atexit
import ctypes
import logging
import os
import sys
import threading

from keras_ipu.device.compiler import library_preload
from keras_ipu.device.native import threads as host_threads

logger = logging.getLogger("keras_ipu.device")

# TensorFlow's C++ libraries in its package (pip's layout), loaded before
# its import with the interpreter lock released (tensorflow_ready).
TENSORFLOW_LIBRARIES = "libtensorflow*.so*"


class Abandoned(Exception):
    """A background compile stopped because the process is exiting."""


# -- the import ---------------------------------------------------------------

_tf_lock = threading.Lock()
_tf_configured = False


# TensorFlow's C++ log level at our import when the user set none: 1 drops
# its INFO lines (CPU features, "XLA service ... initialized", StreamExecutor,
# "Compiled cluster using XLA"), which `auto`'s background compile would
# print into the user's progress bar; warnings and errors still show.
QUIET_TF_LOG_LEVEL = "1"
TF_LOG_LEVEL_ENV = "TF_CPP_MIN_LOG_LEVEL"


def quiet_tensorflow_start(environ=os.environ, modules=sys.modules):
    """Before TensorFlow is imported for us (here, or by Keras under the ipu
    backend): its C++ INFO lines off, unless the user chose a level or
    imported TensorFlow (then its logging is theirs). The level stays set:
    TensorFlow reads it once, when it starts logging (jax's import sets the
    same default)."""
    if "tensorflow" not in modules:
        environ.setdefault(TF_LOG_LEVEL_ENV, QUIET_TF_LOG_LEVEL)


# TensorFlow's variables for the sizes of its intra-op pool (its kernels'
# threads, XLA's included) and its inter-op pool (the graph runtime's
# operations at once), in that order: a value the user set is theirs.
TF_POOL_VARIABLES = ("TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS")


def tensorflow_pool_sizes(environ=os.environ):
    """{pool variable: size} for TensorFlow's pools whose size is ours to
    set: the host-thread cap (device/native/threads.py's variables, the
    smallest set one) for each pool whose variable the user left unset;
    {} where no cap is set (TensorFlow's default: the cores this process
    may use). The module doc's Threads paragraph says why."""
    cap = host_threads.user_cap(environ)
    if cap is None:
        return {}
    return {name: cap for name in TF_POOL_VARIABLES if not environ.get(name, "").strip()}


def _size_pools(tf):
    """TensorFlow's pools sized by tensorflow_pool_sizes, except one the
    user sized with tf.config.threading, or once TensorFlow's runtime runs
    (its pools exist: the user ran TensorFlow first)."""
    config = tf.config.threading
    pools = dict(zip(TF_POOL_VARIABLES, (
        (config.get_intra_op_parallelism_threads, config.set_intra_op_parallelism_threads),
        (config.get_inter_op_parallelism_threads, config.set_inter_op_parallelism_threads),
    )))
    for name, size in tensorflow_pool_sizes().items():
        get, set_size = pools[name]
        if get() != 0:  # 0 until someone sets it
            continue
        try:
            set_size(size)
        except RuntimeError:
            logger.debug("TensorFlow already running: its pools keep their size "
                         "(%s=%d not applied)", name, size)
            return


def import_tensorflow():
    """TensorFlow, imported (once) and its pools sized (_size_pools)."""
    global _tf_configured
    with _tf_lock:
        quiet_tensorflow_start()
        import tensorflow as tf

        if not _tf_configured:
            _tf_configured = True
            _size_pools(tf)
        return tf


# -- priority: the compile in the background, TensorFlow's runtime not --------

_runtime_lock = threading.Lock()
_runtime_thread = None
# A compile began importing TensorFlow / finished it: between the two, its
# C++ libraries are partly loaded and initialised (what the exit must not
# tear down).
_import_began = threading.Event()
_import_done = threading.Event()
# Set when TensorFlow is imported for a program that will be compiled: the
# starter thread then starts the runtime.
_tf_imported = threading.Event()
_runtime_started = threading.Event()
_exiting = threading.Event()
# The runtime's start is a second or two of TensorFlow's C++; the exit
# waits that long for it rather than let it return into a finalized
# interpreter (which aborts the process: "terminate called ...").
_RUNTIME_START_JOIN_SECONDS = 60.0


def start_runtime_starter():
    """The thread that starts TensorFlow's runtime (once per process):
    started by a thread at normal priority, so that the runtime's thread
    pools, which inherit the priority of the thread that starts them, are
    not at the background compile's."""
    global _runtime_thread
    with _runtime_lock:
        if _runtime_thread is None:
            _runtime_thread = threading.Thread(
                target=_start_runtime, daemon=True,
                name="keras_ipu TensorFlow runtime start")
            _runtime_thread.start()


def _start_runtime():
    _tf_imported.wait()
    try:
        if _exiting.is_set():  # nothing left to start it for
            return
        tf = import_tensorflow()
        # An eager op starts the pools programs run on. No XLA call: XLA's
        # compile pool would start here at normal priority (module doc).
        tf.add(tf.constant(1.0), 1.0)
    except Exception as error:  # noqa: BLE001 - the compile reports its own
        logger.debug("starting TensorFlow's runtime failed: %r", error)
    finally:
        _runtime_started.set()


def tensorflow_ready(graph, modes, check):
    """In the compile thread, at background priority: TensorFlow and the
    emitter imported (at exit the import stops at its next module:
    _StopImports), then, when `graph` can be emitted in one of the
    emitter's `modes`, TensorFlow's runtime started by the starter thread
    (waited for stoppably)."""
    _import_began.set()
    if "tensorflow" not in sys.modules:
        preload_tensorflow_libraries()
    import_tensorflow()
    from keras_ipu.device.to_tensorflow import missing_rules

    _import_done.set()
    if any(not missing_rules(graph, mode) for mode in modes):
        _tf_imported.set()
        while not _runtime_started.wait(0.05):
            check()


def preload_tensorflow_libraries():
    """TensorFlow's C++ libraries loaded with the interpreter lock released
    (library_preload.py), before the import that would load them holding
    it: at nice 19 that block of seconds stalls the training thread."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("tensorflow")
    except (ImportError, ValueError):
        return
    if spec is None or not spec.submodule_search_locations:
        return  # not installed: the import reports it
    for directory in spec.submodule_search_locations:
        library_preload.preload(directory, TENSORFLOW_LIBRARIES)


# -- the process's exit -------------------------------------------------------

_in_flight = set()
_in_flight_lock = threading.Lock()
_exit_registered = False


def in_flight_add(runner):
    global _exit_registered
    with _in_flight_lock:
        _in_flight.add(runner)
        if not _exit_registered:
            _exit_registered = True
            atexit.register(_at_exit)


def in_flight_discard(runner):
    with _in_flight_lock:
        _in_flight.discard(runner)


def _at_exit():
    """Abandons the background compiles: waits only until each has stopped
    or is inside XLA's C++ compiler. A thread that returns from C++ into a
    finalized interpreter aborts the process, and C++ exit handlers may
    tear down what a running compile uses: if one is left running, the
    process ends with its exit status as soon as Python's finalization
    is done (glibc's on_exit calls _exit before the other exit handlers)."""
    _exiting.set()
    with _in_flight_lock:
        runners = list(_in_flight)
    _StopImports.install({runner.thread for runner in runners})
    for runner in runners:
        runner.abandoned.set()
    for runner in runners:
        runner.unstoppable.wait()
    if _runtime_thread is not None and _tf_imported.is_set():
        _runtime_thread.join(_RUNTIME_START_JOIN_SECONDS)
    # The runtime's start cannot be stopped either (TensorFlow's C++).
    starting = _runtime_thread is not None and _tf_imported.is_set() and _runtime_thread.is_alive()
    # A compile stopped (or failed) inside TensorFlow's import leaves it
    # partly initialised, whose C++ exit handlers crash (module doc).
    partly_imported = _import_began.is_set() and not _import_done.is_set()
    if starting or partly_imported or any(runner.thread.is_alive() for runner in runners):
        _end_at_exit_status()


def exit_began(runner):
    """Whether the process's exit has begun for `runner`'s compile: it was
    abandoned, or the interpreter is shutting down (the main thread has
    ended; the atexit handlers, ours among them, may not have run yet)."""
    return runner.abandoned.is_set() or not threading.main_thread().is_alive()


class _StopImports:
    """First on sys.meta_path from the exit on: an import in an abandoned
    compile's thread raises Abandoned. An import cannot be stopped inside
    a module, only between modules; TensorFlow's (thousands of modules,
    ten seconds and more at nice 19 on a busy machine) then ends within
    one module instead of running on into the interpreter's finalization."""

    def __init__(self, threads):
        self.threads = threads

    @classmethod
    def install(cls, threads):
        if threads:
            sys.meta_path.insert(0, cls(threads))

    def find_spec(self, name, path=None, target=None):
        if threading.current_thread() in self.threads:
            raise Abandoned(f"import of {name} stopped: the process is exiting")
        return None


def _end_at_exit_status():
    try:
        libc = ctypes.CDLL(None)
        on_exit = libc.on_exit
        underscore_exit = libc._exit
    except (OSError, AttributeError):  # not glibc: the usual exit
        return
    on_exit.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    on_exit(ctypes.cast(underscore_exit, ctypes.c_void_p), None)
