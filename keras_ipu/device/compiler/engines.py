"""Which engine computes a compiled program's values on the host.

The simulator's values can come from two engines; the costs (memory,
cycles, profiles) always come from the Executable's own program:

- `numpy`: the Executable's kernel list (NumPy, the C kernel for fused
  chains). The reference, and the only engine where the floating-point
  behaviour needs per-op control (stochastic rounding, traps: numerics.py).
- `xla`: the program emitted as TensorFlow ops (device/to_tensorflow, one
  rule per primitive) and compiled by TensorFlow's XLA CPU compiler as one
  `tf.function(jit_compile=True)`: the whole device loop (the scan over
  `steps_per_execution` steps) is one XLA executable running on all cores.

`KERAS_IPU_ENGINE` chooses:

- `auto` (the default): tiered, as JIT compilers do. A program starts on
  NumPy at once (no TensorFlow import, no XLA compile: first epochs stay
  short). Once it has spent `HOT_SECONDS` of host time, a background
  thread imports TensorFlow and compiles it with XLA while NumPy keeps
  running; when XLA is ready, a few runs on each engine are timed and the
  faster one keeps the program. Programs that run briefly (most of a test
  suite, `compute_output_spec`, a few predict calls) never load
  TensorFlow.
- `xla`: every program whose primitives all have rules runs on XLA from
  its first run (compiled then, in the caller's thread).
- `numpy`: never XLA.

A program with a floating-point behaviour set, with a primitive that has
no TensorFlow rule, or whose XLA compile fails, runs on NumPy (logged once
on the `keras_ipu.device` logger). Threads: XLA uses TensorFlow's intra-op
pool (all cores it may run on); `OMP_NUM_THREADS` caps it, when set before
TensorFlow starts.
"""

import logging
import os
import threading
import time

import numpy as np

from keras_ipu.device.compiler import device_checks
from keras_ipu.device.ir import Graph
from keras_ipu.device.ir import Literal
from keras_ipu.device.ir import Node
from keras_ipu.device.ir import Var

logger = logging.getLogger("keras_ipu.device")

ENGINES = ("auto", "numpy", "xla")
ENV = "KERAS_IPU_ENGINE"
# For developers running the tests on the XLA engine: a program that cannot
# be emitted or compiled raises instead of falling back to NumPy.
STRICT_ENV = "KERAS_IPU_XLA_STRICT"

# Host seconds a program spends on NumPy before `auto` compiles it with
# XLA in the background: TensorFlow's import (2-5 s here) and an XLA
# compile are only worth paying for a program that keeps running.
HOT_SECONDS = 0.3
# Runs timed on each engine before `auto` keeps the faster one.
TIMED_RUNS = 3


def engine_setting():
    value = os.environ.get(ENV, "auto").strip().lower() or "auto"
    if value not in ENGINES:
        raise ValueError(
            f"{ENV}={os.environ.get(ENV)!r} is not an engine: use one of "
            f"{', '.join(ENGINES)} (auto: NumPy first, XLA for programs that "
            "keep running; numpy: never XLA; xla: XLA from the first run)."
        )
    return value


def runner(executable):
    """The function that computes `executable`'s values from a list of
    checked input arrays (Executable.run calls it)."""
    setting = engine_setting()
    if setting == "numpy" or device_checks.is_active(executable.fp_behaviour):
        return executable.run_unchecked
    if setting == "xla":
        program = XlaProgram.build(executable)
        if program is None:
            return executable.run_unchecked
        return program.runner_for(executable)
    return TieredRunner(executable)


# -- the program as a Graph again -----------------------------------------


def graph_of(executable):
    """The Executable's program as a Graph (its records and constants), so
    it can be emitted; works for executables loaded from the disk cache."""
    graph = Graph()
    var_of = {}
    for slot, aval in zip(executable.input_slots, executable.in_avals):
        var_of[slot] = Var(aval)
    graph.inputs = [var_of[s] for s in executable.input_slots]
    literal_of = {s: Literal(v) for s, v in executable.constants.items()}

    def operand(slot):
        return literal_of[slot] if slot in literal_of else var_of[slot]

    for prim, params, ins, outs, _, _, out_avals in executable.records:
        outputs = []
        for slot, aval in zip(outs, out_avals):
            var_of[slot] = Var(aval)
            outputs.append(var_of[slot])
        graph.nodes.append(Node(prim, [operand(s) for s in ins], params, outputs))
    graph.outputs = [operand(s) for s in executable.output_slots]
    return graph


# -- XLA --------------------------------------------------------------------

_tf_lock = threading.Lock()
_tf_configured = False


def _tensorflow():
    """TensorFlow, imported (once) and its intra-op pool capped by
    OMP_NUM_THREADS when the user set it."""
    global _tf_configured
    with _tf_lock:
        import tensorflow as tf

        if not _tf_configured:
            _tf_configured = True
            threads = os.environ.get("OMP_NUM_THREADS")
            if threads and threads.isdigit() and not os.environ.get("TF_NUM_INTRAOP_THREADS"):
                try:
                    tf.config.threading.set_intra_op_parallelism_threads(int(threads))
                except RuntimeError:  # TensorFlow already running
                    pass
        return tf


class XlaProgram:
    """An Executable's program emitted to TensorFlow and compiled by XLA
    (on the first call of `run`)."""

    def __init__(self, executable):
        tf = _tensorflow()
        from keras_ipu.device.to_tensorflow import emit_graph
        from keras_ipu.device.to_tensorflow.emitter import tf_dtype

        graph = graph_of(executable)
        self.name = executable.name or repr(executable)
        specs = [tf.TensorSpec(a.shape, tf_dtype(a.dtype)) for a in executable.in_avals]

        def program(*inputs):
            return emit_graph(graph, list(inputs))

        self._function = tf.function(
            program, input_signature=specs, jit_compile=True, autograph=False,
            reduce_retracing=False,
        )
        self._fast = self._fast_call()

    def _fast_call(self):
        """A call without tf.function's per-argument checks and copies:
        the inputs wrapped as tensors over the NumPy memory, the traced
        function called flat, the results viewed as arrays. That is about
        10 us per argument less than the public path (a step with 60
        weights and slots: 4 ms less). TensorFlow's own internals; the
        public path is the fallback if they are not there."""
        try:
            from tensorflow.python.eager import context
            from tensorflow.python.framework.ops import EagerTensor

            concrete = self._function.get_concrete_function()
            captured = concrete.captured_inputs
            call = concrete._call_flat
            device = context.context().device_name
        except Exception:  # noqa: BLE001 - another TensorFlow: public path
            return None

        def run(arrays):
            outs = call([EagerTensor(a, device, None) for a in arrays], captured)
            if not isinstance(outs, (list, tuple)):
                outs = [outs]
            # 0-d results come back as NumPy scalars: arrays, as everywhere.
            return [v if type(v) is ndarray else np.array(v)
                    for v in [o._numpy() for o in outs]]

        ndarray = np.ndarray
        return run

    @classmethod
    def build(cls, executable, quiet=False):
        """The XlaProgram, or None (logged) when the program cannot be
        emitted."""
        from keras_ipu.device.to_tensorflow import missing_rules

        name = executable.name or "a program"
        try:
            missing = missing_rules(graph_of(executable))
            if missing:
                _note(f"{name} runs on NumPy: no TensorFlow rule for "
                      f"{', '.join(sorted(missing))}")
                return None
            return cls(executable)
        except Exception as error:  # noqa: BLE001 - any failure means NumPy
            _note(f"{name} runs on NumPy: emitting it for XLA failed ({error!r})")
            return None

    def run(self, arrays):
        if self._fast is not None:
            return self._fast(arrays)
        return [np.asarray(t) for t in self._function(*arrays)]

    def runner_for(self, executable):
        """run(), falling back to NumPy for good if XLA cannot compile the
        program (the failure is logged once)."""
        state = {"ok": None}

        def run(arrays):
            if state["ok"] is False:
                return executable.run_unchecked(arrays)
            if state["ok"] is None:
                try:
                    out = self.run(arrays)
                except Exception as error:  # noqa: BLE001
                    state["ok"] = False
                    _note(f"{self.name} runs on NumPy: XLA could not compile it "
                          f"({type(error).__name__}: {str(error)[:500]})")
                    return executable.run_unchecked(arrays)
                state["ok"] = True
                return out
            return self.run(arrays)

        run.engine = "xla"
        return run


_noted = set()


def _note(message):
    if os.environ.get(STRICT_ENV) == "1" and "no TensorFlow rule" not in message:
        raise RuntimeError(message)
    if message not in _noted:
        _noted.add(message)
        logger.info(message)


# -- auto: NumPy first, XLA for hot programs ---------------------------------


class TieredRunner:
    """Runs an Executable on NumPy, compiles it with XLA in the background
    once it is hot, then keeps the faster engine (see the module doc)."""

    def __init__(self, executable):
        self.executable = executable
        self.engine = "numpy"  # numpy | compiling | timing | xla | numpy-final
        self.numpy_seconds = 0.0
        self.numpy_times = []
        self.xla_times = []
        self.program = None
        self.thread = None
        self._written = tuple(sorted(executable.written_inputs))
        self._xla_ran = False

    def __call__(self, arrays):
        engine = self.engine
        if engine == "xla":
            return self.program.run(arrays)
        if engine == "timing":
            return self._timed_xla(arrays)
        if engine == "numpy-final":
            return self._numpy(arrays)
        if engine == "numpy" and self.numpy_seconds >= HOT_SECONDS:
            self._start_compile(arrays)
        start = time.perf_counter()
        out = self._numpy(arrays)
        if self.engine == "numpy":
            elapsed = time.perf_counter() - start
            self.numpy_seconds += elapsed
            self.numpy_times.append(elapsed)
        return out

    def _numpy(self, arrays):
        if self._xla_ran:
            # XLA's results are read-only views of TensorFlow's buffers; the
            # NumPy program writes into the inputs it was donated.
            for k in self._written:
                if not arrays[k].flags.writeable:
                    arrays[k] = np.array(arrays[k])
        return self.executable.run_unchecked(arrays)

    def _start_compile(self, arrays):
        self.engine = "compiling"
        # The compile's first run needs inputs the NumPy runs will not
        # overwrite meanwhile (donated state): its own copies.
        sample = [np.array(a) for a in arrays]
        # Not a daemon: the interpreter waits for it at exit; killing a
        # thread inside TensorFlow's C++ code aborts the process.
        self.thread = threading.Thread(
            target=self._compile, args=(sample,), daemon=False,
            name=f"keras_ipu XLA compile of {self.executable.name}",
        )
        self.thread.start()

    def _compile(self, sample):
        program = XlaProgram.build(self.executable)
        if program is None:
            self.engine = "numpy-final"
            return
        try:
            program.run(sample)  # XLA compiles on the first call
        except Exception as error:  # noqa: BLE001
            _note(f"{program.name} runs on NumPy: XLA could not compile it "
                  f"({type(error).__name__}: {str(error)[:500]})")
            self.engine = "numpy-final"
            return
        self.program = program
        self.engine = "timing"

    def _timed_xla(self, arrays):
        start = time.perf_counter()
        out = self.program.run(arrays)
        self.xla_times.append(time.perf_counter() - start)
        self._xla_ran = True
        if len(self.xla_times) >= TIMED_RUNS:
            xla = min(self.xla_times)
            numpy_ = min(self.numpy_times[-TIMED_RUNS:]) if self.numpy_times else float("inf")
            self.engine = "xla" if xla <= numpy_ else "numpy-final"
            logger.info(
                "%s: XLA %.3g ms, NumPy %.3g ms per run: keeps %s",
                self.executable.name, 1e3 * xla, 1e3 * numpy_,
                "XLA" if self.engine == "xla" else "NumPy",
            )
        return out


def current_engine(executable):
    """'numpy' or 'xla': the engine that computed the executable's last
    run (None before its first run)."""
    run = executable.__dict__.get("_engine_run")
    if run is None:
        return None
    if isinstance(run, TieredRunner):
        return "xla" if run.engine in ("xla", "timing") else "numpy"
    return getattr(run, "engine", "numpy")
