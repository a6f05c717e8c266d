"""The host engines that compute a compiled program's values (KERAS_IPU_ENGINE
chooses one per program: engine_choice.py).

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

TensorFlow's import, its thread pools and the process's exit while a
background compile runs: tensorflow_runtime.py.
"""

import logging
import os
import weakref

import numpy as np

from keras_ipu.device.compiler.tensorflow_runtime import Abandoned
from keras_ipu.device.compiler.tensorflow_runtime import import_tensorflow

logger = logging.getLogger("keras_ipu.device")

# For developers running the tests on the XLA or TensorFlow engine: a
# program that cannot be emitted or compiled raises instead of falling
# back to NumPy.
STRICT_ENV = "KERAS_IPU_XLA_STRICT"


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
    _fast = None  # _fast_call's run, where TensorFlow's internals are there

    def __init__(self, executable, check=None):
        tf = import_tensorflow()
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

        def hold(arrays, indices):
            for k in indices:
                a = arrays[k]
                held = viewed.get(id(a))
                if held is None or held[0]() is not a:
                    tensor = EagerTensor(a, device, None)
                    view = tensor._numpy()
                    if type(view) is ndarray:  # not a 0-d one's NumPy scalar
                        arrays[k] = view
                        viewed[id(view)] = (weakref.ref(view, forgetting(id(view))), tensor)

        ndarray = np.ndarray
        self._tensors_for = tensors_for
        self._hold = hold
        return run

    def hold(self, arrays, indices):
        """Makes the arrays at `indices` (held state: the inputs the NumPy
        engine writes into) tensors now, each replaced in `arrays` by the
        view of its tensor, as this program's own last run would have left
        them: before a run timed against another engine, whose results
        this program's run would otherwise copy in, a cost of alternating
        that the engine kept does not pay (as engines.writable_inputs' copies
        before a NumPy turn). Nothing on the public path (no _fast)."""
        if self._fast is not None:
            self._hold(arrays, indices)

    @classmethod
    def build(cls, executable, check=None):
        """The program, or None (logged) when it cannot be emitted in the
        class's mode; Abandoned passes through."""
        import_tensorflow()  # before the emitter's import of it: configured, quiet
        from keras_ipu.device.to_tensorflow import missing_rules

        name = executable.name or "a program"
        try:
            missing = missing_rules(executable.graph, cls.mode)
            if missing:
                note(f"{name} does not run on {cls.engine}: no TensorFlow rule "
                     f"({cls.mode} mode) for {', '.join(sorted(missing))}")
                return None
            return cls(executable, check)
        except Abandoned:
            raise
        except Exception as error:  # noqa: BLE001 - any failure: another engine
            note(f"{name} does not run on {cls.engine}: emitting it failed ({error!r})")
            return None

    def run(self, arrays):
        if self._fast is not None:
            return self._fast(arrays)
        return [np.asarray(t) for t in self._function(*arrays)]

    def failed(self, error):
        """Notes (once) that the program's first run failed."""
        note(f"{self.name} does not run on {self.engine}: {self.failure} "
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


def note(message):
    """Logs why a program does not run on an engine, once per message
    (keras_ipu.device, DEBUG: quiet by default). Under STRICT_ENV=1 it
    raises instead, so tests see every fallback but a missing rule."""
    if os.environ.get(STRICT_ENV) == "1" and "no TensorFlow rule" not in message:
        raise RuntimeError(message)
    if message not in _noted:
        _noted.add(message)
        logger.debug(message)
