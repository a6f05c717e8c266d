"""Which engine (engines.py) computes a compiled program's values on the host.

`KERAS_IPU_ENGINE` chooses:

- `auto` (the default): tiered, as JIT compilers do (tiered_runner.py).
  A program starts on NumPy at once; once it has run long enough to be
  hot and the program's own work predicts that TensorFlow's engines could
  save a share of its step (engine_prediction.py), they are prepared
  (in the background, or on one host thread by one of its runs) and
  timed against it, and the fastest keeps the program. Programs that run
  briefly never import TensorFlow.
- `xla` / `tensorflow`: every program whose primitives all have rules
  (in the XLA / graph mode) runs on that engine from its first run
  (prepared then, in the caller's thread).
- `numpy`: never TensorFlow.

A program with a floating-point behaviour set, with a primitive that has
no TensorFlow rule, or whose compile (or first run) fails, runs on NumPy
(a debug message, once, on the `keras_ipu.device` logger; nothing else
changes); under `auto` a candidate that fails is skipped.
"""

import os

from keras_ipu.device.compiler import engines
from keras_ipu.device.compiler.tiered_runner import TieredRunner

ENGINES = ("auto", "numpy", "tensorflow", "xla")
ENV = "KERAS_IPU_ENGINE"


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
        return engines.numpy_runner(executable)
    if setting in engines.PROGRAMS:
        program = engines.PROGRAMS[setting].build(executable)
        if program is None:
            return engines.numpy_runner(executable)
        return program.runner_for(executable)
    return TieredRunner(executable)


def current_engine(executable):
    """'numpy', 'tensorflow' or 'xla': the engine that computed the
    executable's last run (None before its first run)."""
    run = executable.__dict__.get("_engine_run")
    if run is None:
        return None
    if isinstance(run, TieredRunner):
        return run.last_engine
    return getattr(run, "engine", "numpy")
