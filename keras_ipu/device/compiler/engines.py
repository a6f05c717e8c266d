"""Which engine computes a compiled program's values on the host.

The simulator's values can come from three engines; the costs (memory,
cycles, profiles) always come from the Executable's own program:

- `numpy`: the Executable's kernel list (NumPy, the C kernel for fused
  chains). The reference, and the only engine where the floating-point
  behaviour needs per-op control (stochastic rounding, traps: numerics.py).
- `xla`: the program emitted as TensorFlow ops (device/to_tensorflow, one
  rule per primitive) and compiled by TensorFlow's XLA CPU compiler as one
  `tf.function(jit_compile=True)`: the whole device loop (the scan over
  `steps_per_execution` steps) is one XLA executable running on all cores.
- `tensorflow`: the same emitter in its graph mode (rules for TensorFlow's
  own kernels where the XLA rules use XLA-only operations) run as a plain
  `tf.function` by TensorFlow's graph runtime: oneDNN's convolutions and
  products, independent operations at once on its inter-op pool. Keras'
  TensorFlow backend without XLA runs this way, and on 2 cores it was the
  fastest of all backends on the CNN, transformer and LSTM of
  benchmarks/fit_throughput.py (issue 16, seventh pass).

`KERAS_IPU_ENGINE` chooses:

- `auto` (the default): tiered, as JIT compilers do. A program starts on
  NumPy at once (no TensorFlow import, no XLA compile: first epochs stay
  short). Once it has spent `HOT_SECONDS` of CPU time, the program is read
  to predict whether TensorFlow's graph runtime could save at least
  `MIN_PREDICTED_GAIN` of its step (engine_prediction.py: only where
  convolutions carry the work, or, on the pinned AVX-512 host where XLA
  has its own prediction, where XLA could; on hosts of up to `PREDICTION_MAX_THREADS`
  threads, where the ratios it uses were measured); if not, it stays on NumPy for good and
  TensorFlow is never imported for it (the import slows the training
  beside it 3-5x on two cores, and on the MLP, LSTM and demo_functional
  `auto` then kept NumPy anyway). If so, a background
  thread imports TensorFlow and prepares it for each of `AUTO_CANDIDATES`
  in turn (TensorFlow's graph runtime: a trace and the graph's
  optimisation on its first run, done by one of the program's own runs,
  CALLER_PREPARES; then XLA, in the background: a trace and XLA's compile)
  while the program keeps running on the fastest engine so far; when a
  candidate is ready, it runs `WARM_UP_RUNS` more runs untimed (its first
  runs are slower than its settled ones), then the next runs alternate
  between the fastest so far and it, `TIMED_RUNS` each (both timed under
  the same load), and the faster keeps the program. After a candidate was timed, the next one
  is prepared only once the program has run, on the engine it has, long
  enough for that candidate to pay (rent-or-buy again, priced by
  `TieredRunner._rent`): XLA, after the graph runtime, once the program's
  CPU times the share of a step XLA is expected to save (at most about a
  quarter, XLA_EXPECTED_GAIN) covers XLA's preparation (about four times
  the graph runtime's, XLA_PREPARATION_RATIO), 5-20 s of program CPU on
  the benchmark's models: XLA's compile, the costliest step, which slows
  the training beside it on a small machine, never falls in the first
  seconds after the graph runtime took over, and a program that stops
  soon never pays for it. Where the prediction also answers for XLA (a
  host its ratios were measured on: engine_prediction.predicted_xla_gain)
  and the graph runtime is predicted to save less than XLA_BEST_SHARE of
  what XLA saves, XLA's rent is that predicted gain, paid since the
  program was found hot, so that XLA follows the graph runtime's turns at
  once on the benchmark's MLP and LSTM on the pinned AVX-512 host (the
  graph runtime stays first there, as a stopgap ready within a second of
  the import, where XLA's niced compile takes seconds), and where the
  graph runtime is not predicted to pay, XLA is the only candidate; a
  program predicted to gain on neither stays on NumPy. Programs that run briefly (most of a test
  suite, `compute_output_spec`, a few predict calls) never load
  TensorFlow. With one host thread (one core, or a cap of 1 from the
  variables device/native/threads.py reads) there is no background:
  a compile beside the program would take the core it runs on (measured
  in issue 16: the one-thread MLP's CPU per step doubled for about 150
  steps while TensorFlow was imported and the step compiled), and a niced
  one would starve there. So a hot program the prediction says could pay
  runs on NumPy until it has paid the rent of ONE_THREAD_RENT_SECONDS of
  program CPU (rent-or-buy on the stall), then one of its runs imports
  TensorFlow and prepares the graph runtime (ONE_THREAD_CANDIDATE; not
  XLA after it) in the program's thread at its priority, the program
  waiting for it (a few seconds: an INFO line on the `keras_ipu.device`
  logger says so), and the timed turns against NumPy decide as above.
  Priority: the background compile (TensorFlow's import, XLA's trace and
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
- `xla` / `tensorflow`: every program whose primitives all have rules
  (in the XLA / graph mode) runs on that engine from its first run
  (prepared then, in the caller's thread).
- `numpy`: never TensorFlow.

A program with a floating-point behaviour set, with a primitive that has
no TensorFlow rule, or whose compile (or first run) fails, runs on NumPy
(a debug message, once, on the `keras_ipu.device` logger; nothing else
changes); under `auto` a candidate that fails is skipped.

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
import time
import weakref

import numpy as np

from keras_ipu.device.compiler import engine_prediction
from keras_ipu.device.compiler import library_preload
from keras_ipu.device.native import threads as host_threads

logger = logging.getLogger("keras_ipu.device")

ENGINES = ("auto", "numpy", "tensorflow", "xla")
ENV = "KERAS_IPU_ENGINE"
# For developers running the tests on the XLA or TensorFlow engine: a
# program that cannot be emitted or compiled raises instead of falling
# back to NumPy.
STRICT_ENV = "KERAS_IPU_XLA_STRICT"

# CPU seconds a program spends on NumPy (the process's, while it runs)
# before `auto` prepares it for TensorFlow's engines in the background. The rent-or-buy
# rule: pay for the compile once the program has spent about what the
# compile costs, so that a program
# that stops early never pays more than twice what the better choice
# would have cost in hindsight. Its cost is at least TensorFlow's import,
# taken from the training's cores and interpreter lock: 2.3 s of CPU (10 s
# of wall time) after Keras' own imports, measured on this 2-core machine
# at load 10 (issue 16, sixth pass), plus the trace and XLA's compile. At 0.3 s a
# 30-step epoch of a small model started the import, which then ran
# through the epochs after it.
HOT_SECONDS = 2.0
# TensorFlow's C++ libraries in its package (pip's layout), loaded before
# its import with the interpreter lock released (_tensorflow_ready).
TENSORFLOW_LIBRARIES = "libtensorflow*.so*"
# Runs timed on each engine before `auto` keeps the faster one.
TIMED_RUNS = 3
# A candidate's runs after its first (the preparing one) that are not
# timed: TensorFlow's graph runtime runs its second and third runs of a
# program slower than the ones after (the transformer, 2-core AMD host:
# 508 and 520 ms, then 150-210; issue 16 tenth pass), and `auto` compared
# them with NumPy's settled runs and kept NumPy where the graph runtime
# was 25% faster. They still compute the program's steps.
WARM_UP_RUNS = 2
# Program CPU seconds before `auto` prepares its next candidate, per CPU
# second of rent that candidate asks (TieredRunner._rent): 1 is rent-or-buy;
# the tests set 0.
RENT_FACTOR = 1.0
# XLA after the graph runtime, as rent-or-buy prices it: its preparation
# (trace, compile, first run) costs about XLA_PREPARATION_RATIO times the
# graph runtime's (trace, first run) in CPU, and it saves at most about
# XLA_EXPECTED_GAIN of a step: the program's CPU foregone while it waits is
# that fraction of its CPU, so XLA is bought once the program has run
# preparation / gain more. Measured (issue 16, eighth and ninth passes,
# benchmarks/README.md): the ratio 3.0-6.4 on the benchmark's five models;
# the steady-state gain of XLA over the graph runtime 0-25% (transformer
# ~5%, LSTM ~0).
XLA_PREPARATION_RATIO = 4.0
XLA_EXPECTED_GAIN = 0.25
# The share of a step TensorFlow's graph runtime must be predicted to save
# (engine_prediction.py) before `auto` imports TensorFlow for a hot program:
# below it, the import (about 5 s of CPU, slowing the training beside it
# 3-5x while it runs on two cores) would not be won back within minutes,
# and a gain that small is within the noise of the timed turns that
# choose the engine. On the seventeenth pass's AVX-512 VM under its
# OPENBLAS_CORETYPE=Haswell the benchmark's models are predicted at: CNN
# 32%, LSTM 16%, transformer 13%, MLP 11%, demo_functional (batch 32, Adam)
# -26% (issue 16, eighteenth pass, s18auto and s18pred); on an AVX2 host, the products
# at a tie, only convolutions could pass it.
MIN_PREDICTED_GAIN = 0.05
# The prediction decides on hosts of up to this many threads
# (host_threads.max_threads()); on larger ones `auto` tries TensorFlow's
# engines for every hot program, as before there was a prediction. Its
# ratios were measured at 2 threads; on 16 cores the NumPy engine was
# 0.17-0.52 of JAX (whose compiler is XLA) on the benchmark's models
# (issue 16), and there the import takes a core the training leaves idle.
PREDICTION_MAX_THREADS = 4
# The engines `auto` tries for a hot program, in this order: TensorFlow's
# graph runtime first (ready sooner: no XLA compile, which takes minutes
# on large programs), then XLA.
AUTO_CANDIDATES = ("tensorflow", "xla")
# Where XLA is predicted to save at least twice what the graph runtime
# saves (the graph runtime's predicted gain under this share of XLA's:
# engine_prediction.predicted_xla_gain, on a host where it has ratios),
# XLA's rent is priced with that prediction and counted from the moment
# the program was found hot (TieredRunner._rent), and where the graph
# runtime is not predicted to pay, XLA is the only candidate. Predicted on
# the seventeenth pass's AMD EPYC, pinned, graph runtime / XLA: MLP b128
# SGD 11% / 26% (0.41), LSTM 16% / 41% (0.40), transformer 13% / 25%
# (0.53), CNN 32% / -32%, demo_functional b32 Adam -26% / -1% (issue 16,
# nineteenth pass, s19auto); measured there (the lead's idle run, CPU per
# step against the NumPy engine's) MLP 0.92 / 0.70 (the graph runtime's
# turns kept NumPy), LSTM 0.77 / 0.68, transformer 0.69 / 0.73, CNN 0.69 /
# 1.32. The transformer is the nearest to the line: the graph runtime's
# gain there is twice its prediction. The graph runtime stays first
# where XLA is predicted best: it is ready 0.2-0.5 s after TensorFlow's
# import (prepared by the program's own run, CALLER_PREPARES), where XLA's
# compile at nice 19 took 4-13 s of wall time after the import at load
# 4-5 (0.2-0.5 s of its CPU; LSTM and MLP, s19auto), during which XLA
# tried first, the graph runtime skipped, left the program on NumPy. With
# the rent priced so, XLA's compile starts right after the graph runtime's
# turns on those programs, and at load 2 XLA was kept at 5.7 s (MLP) and
# 6.2-6.9 s (LSTM) after fit began, against 7.5 and 8.0 s with the rent
# of the other programs (fit_throughput --min-timed-seconds 40, s19auto).
XLA_BEST_SHARE = 0.5
# The candidates prepared (traced, then run once) in the program's own
# thread, in one of its runs, instead of the background: the graph runtime's
# preparation is short (0.3-1.3 s of CPU on the benchmark's models, issue 16
# ninth pass), and at nice 19 on a busy machine it took 46 s to never, so
# that `auto` stayed on NumPy where the graph runtime was 1.3-2.5x faster.
CALLER_PREPARES = ("tensorflow",)
# On one host thread (module doc): the candidate prepared, by a run of the
# program, in its thread. The graph runtime alone: XLA after it saved 0-6%
# at one thread (TensorFlow 2.21, the seventeenth pass's AMD EPYC, pinned;
# issue 16, nineteenth pass, s19one: MLP b128 SGD 2.5 against 2.4 CPU ms
# per step, LSTM 16.7 against 17.8), within the noise of the timed turns
# that would choose it, for another stall of the training of about four
# times the graph runtime's preparation (XLA_PREPARATION_RATIO): nothing
# runs the program meanwhile.
ONE_THREAD_CANDIDATE = "tensorflow"
# The program CPU seconds a hot program on one host thread runs on NumPy
# before that run: rent-or-buy, the price being the stall (TensorFlow's
# import, 2.3 s of CPU after Keras', the trace and the graph's first run)
# and the rent what the graph runtime would save meanwhile, about
# ONE_THREAD_EXPECTED_GAIN of the program's CPU. A program that stops just
# after it paid then took at most 1 + ONE_THREAD_EXPECTED_GAIN times its
# time on NumPy alone. Measured at one thread (s19one, as above): the graph
# runtime's step / the NumPy engine's MLP 0.59 (2.4 / 4.1 CPU ms), LSTM
# 0.63 (17.8 / 28.3), demo_functional b32 Adam 1.28 (7.3 / 5.7; predicted
# to lose, -26%, so never prepared); the 2-thread prediction says 11% and
# 16% for the first two: its sign holds, its size errs towards NumPy, so
# it decides whether and this measured gain when. With this rule
# (fit_throughput.py --threads 1 --min-timed-seconds 40, 2 rounds, load
# 3-4.8, s19auto1): the graph runtime's epochs / the NumPy engine's, CPU
# per step, MLP 0.66 and 0.74, LSTM 0.64 and 0.66; the stall 1.5-1.7 s of
# the program thread's CPU, 1.9-3.3 s of wall on the shared core (the
# import from a warm page cache); fit's default 5 s window never reached
# the rent (the MLP and LSTM unchanged there).
ONE_THREAD_PREPARATION_SECONDS = 3.0
ONE_THREAD_EXPECTED_GAIN = 0.35
ONE_THREAD_RENT_SECONDS = ONE_THREAD_PREPARATION_SECONDS / ONE_THREAD_EXPECTED_GAIN


def engine_setting():
    value = os.environ.get(ENV, "auto").strip().lower() or "auto"
    if value not in ENGINES:
        raise ValueError(
            f"{ENV}={os.environ.get(ENV)!r} is not an engine: use one of "
            f"{', '.join(ENGINES)} (auto: NumPy first, then the faster of "
            "TensorFlow's graph runtime and XLA for programs that keep running; "
            "numpy: never TensorFlow; tensorflow / xla: that engine from the "
            "first run)."
        )
    return value


def runner(executable):
    """The function that computes `executable`'s values from a list of
    checked input arrays (Executable.run calls it)."""
    setting = engine_setting()
    # A floating-point behaviour (None: all off) needs the per-op kernels.
    if setting == "numpy" or executable.fp_behaviour is not None:
        return numpy_runner(executable)
    if setting in PROGRAMS:
        program = PROGRAMS[setting].build(executable)
        if program is None:
            return numpy_runner(executable)
        return program.runner_for(executable)
    return TieredRunner(executable)


def numpy_runner(executable):
    """The NumPy engine's run: the kernel list, after copying any input
    it writes into (a donated one) that is read-only. Arrays TensorFlow
    returned are read-only views of its buffers, and another program
    (or this one after a fallback) may take them as donated state."""
    run = executable.run_unchecked
    writable = writable_inputs(executable)
    if writable is None:
        return run

    def run_copying_read_only(arrays):
        writable(arrays)
        return run(arrays)

    run_copying_read_only.engine = "numpy"
    return run_copying_read_only


def writable_inputs(executable):
    """A function that replaces, in a list of input arrays, each read-only
    one the NumPy engine writes into by a copy; None when it writes into
    none."""
    written = tuple(sorted(executable.written_inputs))
    if not written:
        return None

    def writable(arrays):
        for k in written:
            if not arrays[k].flags.writeable:
                arrays[k] = np.array(arrays[k])

    return writable


# -- TensorFlow: XLA, or its graph runtime -----------------------------------

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


def _tensorflow():
    """TensorFlow, imported (once) and its pools sized (_size_pools)."""
    global _tf_configured
    with _tf_lock:
        quiet_tensorflow_start()
        import tensorflow as tf

        if not _tf_configured:
            _tf_configured = True
            _size_pools(tf)
        return tf


class Abandoned(Exception):
    """A background compile stopped because the process is exiting."""


class TensorFlowProgram:
    """An Executable's program emitted to TensorFlow (traced here) in the
    subclass's emitter `mode`, as a `tf.function` with `jit_compile` (XLA
    compiles it, TensorFlow's graph runtime optimises it, on the first
    call of `run`). `check`, when given, is called before each node is
    emitted; it raises Abandoned to stop."""

    engine = None  # the engine's name (ENGINES)
    mode = None  # the emitter's (to_tensorflow.MODES)
    jit_compile = None
    # What a failed first run means, for the message.
    failure = None

    def __init__(self, executable, check=None):
        tf = _tensorflow()
        from keras_ipu.device.to_tensorflow import emit_graph
        from keras_ipu.device.to_tensorflow.emitter import checked_between_nodes
        from keras_ipu.device.to_tensorflow.emitter import tf_dtype

        graph = executable.graph
        mode = self.mode
        self.name = executable.name or repr(executable)
        specs = [tf.TensorSpec(a.shape, tf_dtype(a.dtype)) for a in executable.in_avals]

        def program(*inputs):
            return emit_graph(graph, list(inputs), mode=mode)

        self._function = tf.function(
            program, input_signature=specs, jit_compile=self.jit_compile,
            autograph=False, reduce_retracing=False,
        )
        if check is not None:
            check()  # after TensorFlow's import
        with checked_between_nodes(check):
            self._function.get_concrete_function()  # the trace
        self._fast = self._fast_call()

    def _fast_call(self):
        """A call without tf.function's per-argument checks: the inputs
        made tensors, the traced function called flat, the results viewed
        as arrays (no copy). That is about 10 us per argument less than
        the public path (a step with 60 weights and slots: 4 ms less).
        TensorFlow's own internals; the public path is the fallback if
        they are not there.

        A tensor made from a NumPy array is a copy of it (TensorFlow 2.21:
        64 MiB took 0.2 s), so an input that is one of the last run's
        results, viewed from a tensor, is given as that tensor: state held
        between runs (fit's weights and optimizer slots) is not copied in
        again each run (demo_functional with Adam: 28 MB per step). The
        view and the tensor share one buffer, so what the view holds now
        (a NumPy run may have written into it) is what the tensor holds."""
        try:
            from tensorflow.python.eager import context
            from tensorflow.python.framework.ops import EagerTensor

            concrete = self._function.get_concrete_function()
            captured = concrete.captured_inputs
            call = concrete._call_flat
            device = context.context().device_name
        except Exception:  # noqa: BLE001 - another TensorFlow: public path
            return None

        # id(view) -> (weak reference to the view, tensor) of the last
        # run's results. An entry goes with its view (the tensor would
        # keep the buffer alive), and the weak reference tells a view
        # from a later array given the same id.
        self._viewed = viewed = {}

        def forgetting(key):
            def forget(ref):
                if viewed.get(key, (None,))[0] is ref:
                    del viewed[key]
            return forget

        def tensors_for(arrays):
            out = []
            for a in arrays:
                held = viewed.get(id(a))
                out.append(held[1] if held is not None and held[0]() is a
                           else EagerTensor(a, device, None))
            return out

        def run(arrays):
            outs = call(tensors_for(arrays), captured)
            if not isinstance(outs, (list, tuple)):
                outs = [outs]
            views = [o._numpy() for o in outs]
            viewed.clear()
            for v, o in zip(views, outs):
                if type(v) is ndarray:
                    viewed[id(v)] = (weakref.ref(v, forgetting(id(v))), o)
            # 0-d results come back as NumPy scalars: arrays, as everywhere.
            return [v if type(v) is ndarray else np.array(v) for v in views]

        ndarray = np.ndarray
        self._tensors_for = tensors_for
        return run

    @classmethod
    def build(cls, executable, check=None):
        """The program, or None (logged) when it cannot be emitted in the
        class's mode; Abandoned passes through."""
        _tensorflow()  # before the emitter's import of it: configured, quiet
        from keras_ipu.device.to_tensorflow import missing_rules

        name = executable.name or "a program"
        try:
            missing = missing_rules(executable.graph, cls.mode)
            if missing:
                _note(f"{name} does not run on {cls.engine}: no TensorFlow rule "
                      f"({cls.mode} mode) for {', '.join(sorted(missing))}")
                return None
            return cls(executable, check)
        except Abandoned:
            raise
        except Exception as error:  # noqa: BLE001 - any failure: another engine
            _note(f"{name} does not run on {cls.engine}: emitting it failed ({error!r})")
            return None

    def run(self, arrays):
        if self._fast is not None:
            return self._fast(arrays)
        return [np.asarray(t) for t in self._function(*arrays)]

    def failed(self, error):
        """Notes (once) that the program's first run failed."""
        _note(f"{self.name} does not run on {self.engine}: {self.failure} "
              f"({type(error).__name__}: {str(error)[:500]})")

    def runner_for(self, executable):
        """run(), falling back to NumPy for good if the first run fails (XLA
        cannot compile the program, or a TensorFlow kernel refuses it; the
        failure is logged once)."""
        state = {"ok": None}

        numpy_run = numpy_runner(executable)

        def run(arrays):
            if state["ok"] is False:
                return numpy_run(arrays)
            if state["ok"] is None:
                try:
                    out = self.run(arrays)
                except Exception as error:  # noqa: BLE001
                    state["ok"] = False
                    run.engine = "numpy"
                    self.failed(error)
                    return numpy_run(arrays)
                state["ok"] = True
                return out
            return self.run(arrays)

        run.engine = self.engine
        return run


class XlaProgram(TensorFlowProgram):
    """Compiled by XLA: one executable for the whole program."""

    engine = "xla"
    mode = "xla"
    jit_compile = True
    failure = "XLA could not compile it"


class GraphProgram(TensorFlowProgram):
    """Run by TensorFlow's graph runtime (no XLA): its own kernels,
    independent operations at once on its inter-op pool."""

    engine = "tensorflow"
    mode = "graph"
    jit_compile = False
    failure = "TensorFlow's graph runtime could not run it"


# KERAS_IPU_ENGINE's TensorFlow engines.
PROGRAMS = {cls.engine: cls for cls in (GraphProgram, XlaProgram)}


_noted = set()


def _note(message):
    if os.environ.get(STRICT_ENV) == "1" and "no TensorFlow rule" not in message:
        raise RuntimeError(message)
    if message not in _noted:
        _noted.add(message)
        logger.debug(message)


# -- auto: NumPy first, TensorFlow's engines for hot programs -----------------


class TieredRunner:
    """Runs an Executable on NumPy; once it is hot, prepares it for each of
    AUTO_CANDIDATES in the background, times each against the fastest
    engine so far and keeps the fastest (see the module doc)."""

    def __init__(self, executable):
        self.executable = executable
        # numpy (not hot yet) | compiling | preparing (the next run
        # prepares a candidate: CALLER_PREPARES) | timing (a candidate) |
        # final; on one host thread foreground (the graph runtime is
        # prepared by a run once the program has paid its rent).
        self.engine = "numpy"
        # Process CPU seconds spent in the program's runs (all engines).
        self.program_seconds = 0.0
        # The fastest engine so far, its name and its timed runs (beside
        # the candidate's).
        self.current = numpy_runner(executable)
        self.current_name = "numpy"
        # Before a timed NumPy run: the copies it would make of read-only
        # state a TensorFlow run returned (a cost of alternating, which the
        # engine kept does not pay).
        self.writable = writable_inputs(executable) or (lambda arrays: None)
        # The engine that computed the last run (current_engine).
        self.last_engine = None
        # The program being timed, handed over by the compile thread, which
        # waits for `timed` before preparing the next: a compile beside the
        # timed runs would slow them. Its warm-up runs left, then its timed
        # runs and the engine so far's, in turn (the engine so far first:
        # the candidate has just run).
        self.candidate = None
        self.warm_up = 0
        self.candidate_times = []
        self.current_times = []
        self.timed = threading.Event()
        # The state once a candidate is timed: the compile thread goes on,
        # or, on one host thread (no compile thread), final.
        self.after_timing = "compiling"
        # The candidate the next run prepares, and (program or None, CPU
        # seconds) once it did (`prepared` set).
        self.to_prepare = None
        self.prepared_program = None
        self.prepared = threading.Event()
        self.thread = None
        # Set by the process's exit: the compile stops and its result is
        # never used.
        self.abandoned = threading.Event()
        # Set once the compile thread can no longer be stopped (inside
        # TensorFlow's C++: XLA's compile, the graph's first run) or has
        # ended: what the exit waits for.
        self.unstoppable = threading.Event()
        # (time.perf_counter(), what) of each step of the tiering, for
        # benchmarks that report when the program changed engines.
        self.events = []
        # The candidates worth trying, in the order they are tried (_could_pay).
        self.candidates = AUTO_CANDIDATES
        # XLA's predicted gain (a share of a step on NumPy) where XLA_BEST_SHARE
        # prices its rent by it, the graph runtime's beside it; and the
        # program's CPU seconds when it was found hot.
        self.xla_gain = self.graph_gain = None
        self.hot_seconds = 0.0
        # What _could_pay predicted, for the events (None: no prediction).
        self.predicted = None

    def _event(self, what):
        self.events.append((time.perf_counter(), what))

    def __call__(self, arrays):
        engine = self.engine
        if engine == "final":
            return self._current_run(arrays)
        if engine == "timing":
            return self._timed_run(arrays)
        if engine == "preparing":
            return self._prepare_here(arrays)
        if engine == "foreground" and self.program_seconds >= ONE_THREAD_RENT_SECONDS:
            return self._prepare_in_foreground(arrays)
        if engine == "numpy" and self.program_seconds >= HOT_SECONDS:
            if not self._could_pay():
                self.engine = "final"
            elif host_threads.max_threads() == 1:
                # Only the graph runtime is prepared there: a program for
                # which only XLA is predicted to pay stays on NumPy.
                if ONE_THREAD_CANDIDATE not in self.candidates:
                    self.engine = "final"
                    self._event(f"hot: one host thread, stays on numpy ({self.predicted})")
                else:
                    self.engine = "foreground"
                    self._event(f"hot: one host thread, {ONE_THREAD_CANDIDATE} prepared after "
                                f"{ONE_THREAD_RENT_SECONDS:.1f} s of program CPU")
            else:
                self._start_compile(arrays)
        self.last_engine = self.current_name
        # CPU time, as the compile's cost is counted: on a busy machine
        # wall time would call a program hot after a few slow runs.
        cpu = time.process_time()
        out = self.current(arrays)
        self.program_seconds += time.process_time() - cpu
        return out

    def _could_pay(self):
        """Whether TensorFlow's graph runtime or XLA is predicted to save at
        least MIN_PREDICTED_GAIN of this program's step (engine_prediction.py),
        read from the program before paying for TensorFlow's import; sets
        the order of the candidates (_order). A program the prediction
        cannot read is tried, as before there was one; so is every program
        on a host of more than PREDICTION_MAX_THREADS threads."""
        if host_threads.max_threads() > PREDICTION_MAX_THREADS:
            return True
        graph = self.executable.running_graph
        try:
            gain = engine_prediction.predicted_gain(graph)
            xla = engine_prediction.predicted_xla_gain(graph)
        except Exception as error:  # noqa: BLE001 - a primitive without a cost rule
            logger.debug("%s: no prediction of TensorFlow's gain (%r): tries it",
                         self.executable.name, error)
            return True
        predicted = f"the graph runtime predicted to save {gain:.0%} of a step" + (
            "" if xla is None else f", XLA {xla:.0%}")
        if self._order(gain, xla):
            self.predicted = predicted
            return True
        self._event(f"hot: stays on numpy ({predicted})")
        logger.debug("%s stays on NumPy: %s", self.executable.name, predicted)
        return False

    def _order(self, gain, xla):
        """Sets the candidates worth trying for the predicted gains `gain`
        (the graph runtime's) and `xla` (None: no prediction): the graph
        runtime where it is predicted to pay, XLA after it; where XLA is
        predicted to pay and the graph runtime to save under XLA_BEST_SHARE
        of its gain, XLA's rent priced by the prediction (_rent), and XLA
        alone if the graph runtime is not predicted to pay. Whether any is
        worth trying."""
        graph_pays = gain >= MIN_PREDICTED_GAIN
        if (xla is not None and xla >= MIN_PREDICTED_GAIN
                and (not graph_pays or gain < XLA_BEST_SHARE * xla)):
            self.candidates = tuple(name for name in AUTO_CANDIDATES
                                    if name == "xla" or graph_pays)
            self.xla_gain, self.graph_gain = xla, gain
        elif not graph_pays:
            self.candidates = ()
        return bool(self.candidates)

    def _start_compile(self, arrays):
        self.engine = "compiling"
        self.hot_seconds = self.program_seconds
        self._event(f"hot: preparing TensorFlow's engines ({' then '.join(self.candidates)}"
                    + (f"; {self.predicted})" if self.predicted else ")"))
        _start_runtime_starter()  # from this thread: normal priority
        # The compile's first run needs inputs the NumPy runs will not
        # overwrite meanwhile (donated state): its own copies.
        sample = [np.array(a) for a in arrays]
        # A daemon, so that the interpreter's exit does not join it; the
        # exit handler (_at_exit) makes ending it safe.
        self.thread = threading.Thread(
            target=self._compile, args=(sample,), daemon=True,
            name=f"keras_ipu TensorFlow compile of {self.executable.name}",
        )
        _in_flight_add(self)
        self.thread.start()

    def _check(self):
        if self.abandoned.is_set():
            raise Abandoned()

    def _compile(self, sample):
        # Only CPU that training and other processes leave idle (module
        # doc, "Priority").
        host_threads.background_priority()
        try:
            self._check()  # the exit began first: import nothing
            self._compile_stoppably(sample)
        except Exception as error:  # noqa: BLE001
            # Stopped at exit, or failed because the interpreter is going
            # down (an import then cannot register its exit handlers):
            # either way nothing is left to report to.
            if not (isinstance(error, Abandoned) or _exit_began(self)):
                raise
            logger.debug("%s: TensorFlow compile abandoned at exit (%r)",
                         self.executable.name, error)
        finally:
            self.unstoppable.set()
            _in_flight_discard(self)

    def _compile_stoppably(self, sample):
        try:
            _tensorflow_ready(self.executable.graph, self._check)
            self._event("TensorFlow imported")
        except ImportError as error:
            if _exit_began(self):
                raise
            _note(f"{self.executable.name or 'a program'} runs on NumPy: "
                  f"TensorFlow could not be imported ({error!r})")
            self.engine = "final"
            return
        timed = None  # the engine timed since the last rent, and its preparation's CPU
        for name in self.candidates:
            if timed is not None:
                self._pay_rent(self._rent(name, *timed))
                timed = None
            if name in CALLER_PREPARES:
                program, prepared = self._prepared_by_caller(name)
            else:
                program, prepared = self._prepare(name, sample)
            if program is None:
                continue
            if self.abandoned.is_set():
                return
            self.timed.clear()
            self._time_candidate(program, f"{name} ready ({prepared:.2f} s of CPU to prepare)")
            timed = (name, prepared)
            while not self.timed.wait(0.05):
                self._check()
        self._event(f"final: {self.current_name}")
        self.engine = "final"

    def _prepare(self, name, sample):
        """In the compile thread: candidate `name` traced and run once on
        `sample` (compiled / optimised on the first call); (program or
        None, this thread's CPU seconds)."""
        start = time.thread_time()
        program = PROGRAMS[name].build(self.executable, check=self._check)
        if program is None:
            return None, 0.0
        self._check()
        self.unstoppable.set()
        if self._candidate_run(program, sample) is None:
            return None, 0.0
        return program, time.thread_time() - start

    def _prepared_by_caller(self, name):
        """In the compile thread: the program's next run prepares candidate
        `name` (_prepare_here); waits for it, stoppably."""
        self.prepared.clear()
        self.to_prepare = name
        self.engine = "preparing"
        while not self.prepared.wait(0.05):
            self._check()
        return self.prepared_program

    def _prepare_here(self, arrays):
        """A run that prepares the candidate the compile thread asked for,
        in the program's thread at its priority (CALLER_PREPARES): traced
        and run on this run's inputs, whose results it returns (TensorFlow
        writes into no input, so the engine so far runs them as they are
        if the candidate fails). Its CPU is not the program's."""
        name = self.to_prepare
        start = time.thread_time()
        program = PROGRAMS[name].build(self.executable)
        out = None if program is None else self._candidate_run(program, arrays)
        if out is None:
            program = None
        self.prepared_program = (program, time.thread_time() - start)
        self.engine = "compiling"
        self.prepared.set()
        if out is None:
            return self._current_run(arrays)
        self.last_engine = name
        return out

    def _prepare_in_foreground(self, arrays):
        """On one host thread: this run imports TensorFlow and prepares its
        graph runtime (_prepare_here), at the program's priority, then the
        runs after time it against NumPy (module doc)."""
        name = ONE_THREAD_CANDIDATE
        self.engine = self.after_timing = "final"  # whatever happens below, once
        start = time.thread_time()
        self._event(f"one host thread: preparing {name} in the program's thread")
        # Seconds without a step: said where a user looks for it, quietly
        # (INFO, as the choice after the timed runs).
        logger.info("%s: preparing TensorFlow's graph runtime in this thread (one "
                    "host thread): TensorFlow's import and the trace, a few seconds",
                    self.executable.name)
        try:
            _tensorflow()
        except ImportError as error:
            _note(f"{self.executable.name or 'a program'} runs on NumPy: "
                  f"TensorFlow could not be imported ({error!r})")
            return self._current_run(arrays)
        self.to_prepare = name
        out = self._prepare_here(arrays)
        program, _ = self.prepared_program
        self.engine = "final"  # not "compiling": no compile thread takes over
        if program is not None:
            self._time_candidate(program, f"{name} ready ({time.thread_time() - start:.2f} s "
                                          "of CPU to import TensorFlow and prepare)")
        return out

    def _time_candidate(self, program, event):
        """The runs from the next on: `program`'s WARM_UP_RUNS, then its
        timed turns against the engine so far (_timed_run)."""
        self.candidate, self.warm_up = program, WARM_UP_RUNS
        self.candidate_times, self.current_times = [], []
        self._event(event)
        self.engine = "timing"

    def _candidate_run(self, program, arrays):
        """`program`'s results of `arrays`, or None when it failed (noted
        once): TensorFlow writes into no input, so the engine so far then
        runs the same arrays."""
        try:
            return program.run(arrays)
        except Exception as error:  # noqa: BLE001 - a kernel refused these inputs
            program.failed(error)
            return None

    def _current_run(self, arrays):
        self.last_engine = self.current_name
        return self.current(arrays)

    def _rent(self, name, timed, prepared):
        """The program CPU seconds to wait for before preparing candidate
        `name`, after candidate `timed` took `prepared` CPU seconds (of
        the thread that prepared it) to prepare. Rent-or-buy: buy once the rent paid
        equals the price. XLA after the graph runtime: the price is XLA's
        preparation, estimated from the graph runtime's on the same
        program (XLA_PREPARATION_RATIO), and the rent is what XLA would
        save meanwhile, at most XLA_EXPECTED_GAIN of the program's CPU;
        with the graph runtime's 0.3-1.3 s that is 5-20 s of program CPU.
        Paying for XLA as if it saved the whole step (the eighth pass's
        rule: wait as much CPU as the preparations so far took) put its
        compile, which slows the training beside it on 2 cores, into the
        first 10 s of every fit that took the graph runtime. Where XLA is
        predicted to save at least twice the graph runtime's gain
        (XLA_BEST_SHARE), the rent is its predicted gain over the engine
        kept, paid since the program was found hot (the program has
        forgone it since then: TensorFlow's import, 2-30 s of wall time
        on two cores, and the graph runtime's turns), so XLA follows at
        once where that already covers the price (the MLP and LSTM on the
        pinned AVX-512 host). Any other order: the preparations so far
        (this thread's CPU), as if the candidate saved the whole step."""
        if name == "xla" and timed == "tensorflow":
            price = XLA_PREPARATION_RATIO * prepared
            if self.xla_gain is None:
                return RENT_FACTOR * price / XLA_EXPECTED_GAIN
            kept = self.graph_gain if self.current_name == "tensorflow" else 0.0
            paid = self.program_seconds - self.hot_seconds
            return RENT_FACTOR * max(0.0, price / (self.xla_gain - kept) - paid)
        return RENT_FACTOR * time.thread_time()

    def _pay_rent(self, rent):
        """In the compile thread, before the next candidate: waits until
        the program has spent, on the engine it has, `rent` CPU seconds
        more (_rent). A program that stops soon never pays for XLA's
        compile (1.5-5.6 s of CPU on the benchmark's models, issue 16
        ninth pass), and the background work stays a fraction of the CPU."""
        start = self.program_seconds
        self._event(f"rests until the program has run {rent:.2f} s of CPU more")
        while self.program_seconds - start < rent:
            self._check()
            time.sleep(0.05)

    def _timed_run(self, arrays):
        """A run while a candidate is timed: its warm-up runs (WARM_UP_RUNS),
        then the engine so far and the candidate in turn, each run timed,
        so that both are timed under the same load (a busy machine's load
        changes within seconds)."""
        program = self.candidate
        if not self.warm_up and len(self.current_times) <= len(self.candidate_times):
            self.writable(arrays)  # not timed: see __init__
            start = time.perf_counter()
            out = self._current_run(arrays)
            self.current_times.append(time.perf_counter() - start)
        else:
            start = time.perf_counter()
            out = self._candidate_run(program, arrays)
            if out is None:
                self._timing_done()
                return self._current_run(arrays)
            if self.warm_up:
                self.warm_up -= 1
            else:
                self.candidate_times.append(time.perf_counter() - start)
            self.last_engine = program.engine
        if len(self.candidate_times) >= TIMED_RUNS:
            self._keep_the_faster()
        return out

    def _keep_the_faster(self):
        """The candidate's fastest timed run against the fastest engine
        so far's: the faster keeps the program."""
        program = self.candidate
        new, old = min(self.candidate_times), min(self.current_times)
        logger.info("%s: %s %.3g ms, %s %.3g ms per run: keeps %s",
                    self.executable.name, program.engine, 1e3 * new,
                    self.current_name, 1e3 * old,
                    program.engine if new <= old else self.current_name)
        if new <= old:
            self.current, self.current_name = program.run, program.engine
        self._event(f"keeps {self.current_name}")
        self._timing_done()

    def _timing_done(self):
        """The candidate dropped or kept: the compile thread goes on to the
        next candidate, or ends."""
        self.candidate, self.candidate_times, self.current_times = None, [], []
        self.engine = self.after_timing
        self.timed.set()


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


def _start_runtime_starter():
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
        tf = _tensorflow()
        # An eager op starts the pools programs run on. No XLA call: XLA's
        # compile pool would start here at normal priority (module doc).
        tf.add(tf.constant(1.0), 1.0)
    except Exception as error:  # noqa: BLE001 - the compile reports its own
        logger.debug("starting TensorFlow's runtime failed: %r", error)
    finally:
        _runtime_started.set()


def _tensorflow_ready(graph, check):
    """In the compile thread, at background priority: TensorFlow and the
    emitter imported (at exit the import stops at its next module:
    _StopImports), then, when `graph` can be emitted, TensorFlow's runtime
    started by the starter thread (waited for stoppably)."""
    _import_began.set()
    if "tensorflow" not in sys.modules:
        _preload_tensorflow_libraries()
    _tensorflow()
    from keras_ipu.device.to_tensorflow import missing_rules

    _import_done.set()
    if any(not missing_rules(graph, PROGRAMS[name].mode) for name in AUTO_CANDIDATES):
        _tf_imported.set()
        while not _runtime_started.wait(0.05):
            check()


def _preload_tensorflow_libraries():
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


def _in_flight_add(runner):
    global _exit_registered
    with _in_flight_lock:
        _in_flight.add(runner)
        if not _exit_registered:
            _exit_registered = True
            atexit.register(_at_exit)


def _in_flight_discard(runner):
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


def _exit_began(runner):
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


def current_engine(executable):
    """'numpy', 'tensorflow' or 'xla': the engine that computed the
    executable's last run (None before its first run)."""
    run = executable.__dict__.get("_engine_run")
    if run is None:
        return None
    if isinstance(run, TieredRunner):
        return run.last_engine
    return getattr(run, "engine", "numpy")
