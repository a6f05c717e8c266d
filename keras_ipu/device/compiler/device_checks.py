"""What the compiler asks the simulator about a program it compiles.

- For which IPU: the target of the configured system. Nothing here creates
  or installs a system: when none is configured, a transient default one
  (what current_system() would make from TF_POPLAR_FLAGS now) answers, so
  flags set later in the script still apply, as they would on the IPU.
- Does it fit: memory_model.analyze_memory gives `exe.memory` at compile
  time; a tile that overflows fails the compile with IPUOutOfMemoryError,
  after the profile report is written (Poplar's IPU Model writes it too).
- How fast: prediction.predict_costs gives `exe.prediction`, computed once
  per executable when first asked for (a report, --log_cycle_count, or the
  caller), not on every compile: it costs more than the memory check.
- With which floating-point behaviour: numerics.current_fp_behaviour().

Compile time pays for the memory analysis only (well under a millisecond
for an MLP train step); see tests/compiler/test_device_checks.py.
"""

import contextlib
import contextvars
import dataclasses
import logging
import os

from keras_ipu.device import flags as poplar_flags
from keras_ipu.device.compiler import recompute as _recompute
from keras_ipu.device.compiler.options import CONFIGURED
from keras_ipu.device.simulator import memory_model
from keras_ipu.device.simulator import system as _system
from keras_ipu.device.simulator import targets as _targets

logger = logging.getLogger("keras_ipu.compiler")


@dataclasses.dataclass(frozen=True)
class CompileContext:
    """What a compile depends on besides the graph and the pass options."""

    target: object  # IPUTarget
    fp_behaviour: object  # hashable; None: every behaviour off
    flags: object  # PoplarFlags in force
    ipu_model: bool
    # IPUConfig.allow_recompute: CONFIGURED recomputation means Auto.
    allow_recompute: bool = False


# (system it was made for, TF_POPLAR_FLAGS text, context): one entry is
# enough, the system changes rarely; jit asks on every call.
_memo = (object(), None, None)
_ENV_KEY = os.environ.encodekey(poplar_flags.ENV_VAR) if hasattr(
    os.environ, "encodekey") else poplar_flags.ENV_VAR


def _flags_text():
    # os.environ.get of an unset variable raises and catches a KeyError
    # inside (microseconds); jit asks on every call, so read the mapping.
    data = getattr(os.environ, "_data", None)
    if data is None:
        return os.environ.get(poplar_flags.ENV_VAR)
    return data.get(_ENV_KEY)


def compile_context():
    """The CompileContext of the configured system (memoised)."""
    global _memo
    current = _system._current  # never create a system just to compile
    memo_system, memo_env, context = _memo
    if current is not None:
        if memo_system is current:
            return context
        env = None
    else:
        env = _flags_text()
        if memo_system is None and memo_env == env:
            return context
    if current is None:
        from keras_ipu.device.config.ipu_config import IPUConfig
        from keras_ipu.device.config.system_config import build_system

        default = build_system(
            IPUConfig(), flags=poplar_flags.read_flags(print_help=False), default=True
        )
        context = CompileContext(default.target, None, default.flags, default.ipu_model)
    else:
        context = CompileContext(
            current.target, _fp_behaviour(), current.flags, current.ipu_model,
            bool(getattr(current.config, "allow_recompute", False)),
        )
    _memo = (current, env, context)
    return context


def _fp_behaviour():
    try:
        from keras_ipu.device.simulator import numerics
    except ImportError:  # written by another helper; nothing to honour yet
        return None
    behaviour = numerics.current_fp_behaviour()
    # All off is one key, None, whatever its spelling: programs compiled
    # before and after configuring a default IPUConfig are the same.
    return behaviour if is_active(behaviour) else None


def resolve_options(options, context=None):
    """`options` with its target, fp_behaviour and recomputation made
    concrete (the configured ones where they say so): the form the cache
    keys on."""
    target, behaviour = options.target, options.fp_behaviour
    recomputation = options.recomputation
    if (target is not None and not isinstance(target, str)
            and behaviour != CONFIGURED and recomputation != CONFIGURED):
        return options
    context = context or compile_context()
    if target is None:
        target = context.target
    elif isinstance(target, str):
        target = _targets.get_target(target)
    if behaviour == CONFIGURED:
        behaviour = context.fp_behaviour
    if recomputation == CONFIGURED:
        recomputation = True if context.allow_recompute else None
    return dataclasses.replace(options, target=target, fp_behaviour=behaviour,
                               recomputation=_recompute.as_mode(recomputation))


# -- after compiling ------------------------------------------------------------
def check_executable(exe, target, context=None):
    """Attach the memory report of `exe` on `target`, write its profile
    report and log its cycles when asked; raise IPUOutOfMemoryError when a
    tile overflows (after the report is written)."""
    context = context or compile_context()
    exe.target = target
    exe.memory = memory_model.analyze_memory(exe, target)
    announce(exe, context)
    if not exe.memory.fits:
        error = memory_model.IPUOutOfMemoryError(exe.memory)
        error.executable = exe
        if not _allow_out_of_memory():
            raise error
        _warn_out_of_memory(exe, target)
        exe.out_of_memory = error  # compiled anyway: a real IPU could not run it
    return exe


def _allow_out_of_memory():
    from keras_ipu.device.simulator import profile

    return profile.allow_out_of_memory()


def _warn_out_of_memory(exe, target):
    import warnings

    from keras_ipu.device.simulator import profile
    from keras_ipu.device.units import fmt_bytes

    mem = exe.memory
    tiles, over, fullest = profile.tile_overflow(exe, target)
    warnings.warn(memory_model.IPUOutOfMemoryWarning(
        f"{exe.name or 'This program'} does not fit on IPU {mem.ipu} of {target.name}: "
        f"{tiles} of its {target.tiles_per_ipu} tiles are over their "
        f"{fmt_bytes(target.sram_bytes_per_tile)}, the fullest (tile {mem.tile}, "
        f"{fmt_bytes(fullest)}) by {fmt_bytes(over)}; peak at program step "
        f"{mem.peak_step} ({mem.peak_step_name}). debug.allowOutOfMemory is set, so it "
        "was compiled and the simulator runs it, but a real IPU could not run it. The "
        "profile report (POPLAR_ENGINE_OPTIONS autoReport, python -m keras_ipu.report) "
        "shows which tiles overflow and by how much."), stacklevel=4)


# What the caller compiling a program knows of how it will run (samples
# per step, steps per run, inputs/outputs that stay on the IPU): the trainer
# sets it around its device loop, predictions of the programs obtained
# meanwhile use it.
_WORKLOAD = contextvars.ContextVar("keras_ipu_workload", default=None)


@contextlib.contextmanager
def workload(**kwargs):
    """Within: executables compiled (or loaded) are predicted for this
    workload (predict_costs' batch_size, steps_per_run, resident_inputs,
    resident_outputs; negative indices count from the end), and profiled
    with input_categories (the memory category of each input: "weights",
    "optimizer state", "stream buffers", ... see simulator/profile.py)."""
    token = _WORKLOAD.set(kwargs)
    try:
        yield
    finally:
        _WORKLOAD.reset(token)


def announce(exe, context=None):
    """What a newly obtained executable (compiled, or loaded from the disk
    cache) tells the user: --log_cycle_count, and the profile report."""
    exe.workload = _WORKLOAD.get()
    context = context or compile_context()
    if context.flags.log_cycle_count >= 0:
        try:
            exe._prediction = predict(exe, log=True)
        except Exception as e:  # noqa: BLE001 - a diagnostic must not stop the program
            logger.warning("no cycle prediction for %s: %s: %s",
                           exe.name or "program", type(e).__name__, e)
    _write_report(exe)


def predict(exe, log=False, **workload):
    """The Prediction of `exe` on the target it was compiled for."""
    from keras_ipu.device.simulator.prediction import predict_costs

    target = exe.target if exe.target is not None else compile_context().target
    workload = {**(getattr(exe, "workload", None) or {}), **workload}
    workload.pop("input_categories", None)  # the profile's, not the cost model's
    return predict_costs(exe, target, log=log, **workload)


def _write_report(exe):
    try:
        from keras_ipu.device.simulator import profile
    except ImportError:  # written by another helper; no reports until then
        return None
    options = profile.report_options()  # bad options: the user's error, raised
    if options is None:
        return None
    try:
        path = profile.write_executable_report(exe, options, getattr(exe, "name", None))
    except Exception as e:  # noqa: BLE001 - a diagnostic must not stop the program
        logger.warning("no profile report for %s: %s: %s",
                       exe.name or "program", type(e).__name__, e)
        return None
    logger.info("profile report of %s written to %s", exe.name or "program", path)
    return path


# -- the floating-point behaviour in the kernels --------------------------------
def kernel_wrapper(behaviour):
    """numerics.wrap_kernel when `behaviour` asks for anything, else None
    (kernels then run untouched)."""
    if not is_active(behaviour):
        return None
    try:
        from keras_ipu.device.simulator import numerics
    except ImportError:
        return None
    return numerics.wrap_kernel


def is_active(behaviour):
    """Whether a floating-point behaviour turns anything on: any true flag
    or any mode other than OFF, however the value is structured."""
    if behaviour is None or behaviour is False:
        return False
    try:
        from keras_ipu.device.simulator import numerics
    except ImportError:
        numerics = None
    decide = getattr(numerics, "is_active", None)
    if decide is not None:
        return bool(decide(behaviour))
    if isinstance(behaviour, dict):
        return any(is_active(v) for v in behaviour.values())
    if dataclasses.is_dataclass(behaviour):
        return any(is_active(getattr(behaviour, f.name))
                   for f in dataclasses.fields(behaviour))
    if isinstance(behaviour, (tuple, list, set, frozenset)):
        # (name, value) pairs count by their value; a bare name (in a set of
        # the behaviours turned on) counts as on.
        return any(
            is_active(v[1]) if isinstance(v, tuple) and len(v) == 2
            and isinstance(v[0], str) else is_active(v)
            for v in behaviour
        )
    name = getattr(behaviour, "name", None)  # an enum such as StochasticRounding
    if name is not None:
        return name != "OFF"
    if isinstance(behaviour, str):
        return behaviour.lower() not in ("", "off", "false", "none")
    return bool(behaviour)
