"""What the compiler asks the simulator about a program it compiles.

- For which IPU: the target of the configured system
  (system_config.configuration(): the installed system's, or the default one
  TF_POPLAR_FLAGS describe now, made to answer and not installed, so flags
  set later in the script still apply, as they would on the IPU).
- Does it fit: memory_model.analyze_memory gives `exe.memory` at compile
  time; a tile that overflows fails the compile with IPUOutOfMemoryError,
  after the profile report is written (Poplar's IPU Model writes it too).
- How fast: prediction.predict_costs gives `exe.prediction`, computed once
  per executable when first asked for (a report, --log_cycle_count, or the
  caller), not on every compile: it costs more than the memory check.
- With which floating-point behaviour: the configured system's, fixed in the
  executable's kernels by numerics.wrap_kernel.

Compile time pays for the memory analysis only (well under a millisecond
for an MLP train step); see tests/compiler/test_device_checks.py.
"""

import contextlib
import contextvars
import dataclasses
import logging
import warnings

from keras_ipu.device.compiler import recompute as _recompute
from keras_ipu.device.compiler.options import CONFIGURED
from keras_ipu.device.config import system_config
from keras_ipu.device.simulator import memory_model
from keras_ipu.device.simulator.feeds import feeds_of
from keras_ipu.device.simulator import numerics
from keras_ipu.device.simulator import profile
from keras_ipu.device.simulator import sharding
from keras_ipu.device.simulator import targets as _targets
from keras_ipu.device.simulator.prediction import predict_costs
from keras_ipu.device.units import fmt_bytes

logger = logging.getLogger("keras_ipu.compiler")


def resolve_options(options, context=None):
    """`options` with its target, fp_behaviour and recomputation made
    concrete (the configured ones where they say so; recomputation
    CONFIGURED is Auto when the IPUConfig has allow_recompute): the form the
    cache keys on. All off is one key, None, whatever its spelling:
    programs compiled before and after configuring a default IPUConfig are
    the same."""
    target, behaviour = options.target, options.fp_behaviour
    recomputation = options.recomputation
    if (target is not None and not isinstance(target, str)
            and behaviour != CONFIGURED and recomputation != CONFIGURED):
        return options
    context = context or system_config.configuration()
    if target is None:
        target = context.target
    elif isinstance(target, str):
        target = _targets.get_target(target)
    if behaviour == CONFIGURED:
        behaviour = context.fp_behaviour if context.fp_behaviour.active else None
    if recomputation == CONFIGURED:
        recomputation = True if context.allow_recompute else None
    return dataclasses.replace(options, target=target, fp_behaviour=behaviour,
                               recomputation=_recompute.as_mode(recomputation))


# -- after compiling ------------------------------------------------------------
def check_executable(exe, target, context=None, pipeline=None):
    """Attach the memory reports of `exe` on `target` (one per IPU it runs
    on: `memory_by_ipu`; `memory`: the fullest IPU's), write its profile
    report and log its cycles when asked; raise IPUOutOfMemoryError naming
    the first IPU with a tile that overflows (after the report is written).
    `pipeline`: its schedule (CompileOptions.pipeline), kept as
    `exe.pipeline`: a pipelined program's prediction and memory per IPU
    follow it."""
    context = context or system_config.configuration()
    exe.target = target
    split = exe.tensor_parallel
    fed = feeds_of(exe, _WORKLOAD.get())
    if split is None:
        exe.memory_by_ipu = {
            ipu: memory_model.analyze_memory(exe, target, ipu=ipu, feeds=fed)
            for ipu in exe.ipus
        }
    else:
        # SPMD: every IPU of the mesh axis runs the one-IPU part on its
        # blocks, so each holds what that part holds (tensor_parallel.py).
        one = memory_model.analyze_memory(split.local, target)
        exe.memory_by_ipu = {ipu: dataclasses.replace(one, ipu=ipu)
                             for ipu in range(split.ipus)}
    exe.pipeline = pipeline
    if pipeline is not None:
        # A pipelined program's IPUs also hold the activations of the
        # micro-batches in flight under its schedule, and not the optimizer
        # state it offloads: its prediction counts both (sharding.py).
        exe.workload = _WORKLOAD.get()
        exe._prediction = predict(exe)
        exe.memory_by_ipu.update({p.ipu: p.memory for p in exe._prediction.pipeline.ipus})
    exe.memory = max(exe.memory_by_ipu.values(), key=lambda m: m.tile_bytes)
    announce(exe, context)
    for report in exe.memory_by_ipu.values():
        if not report.fits:
            error = memory_model.IPUOutOfMemoryError(report)
            error.executable = exe
            if not profile.allow_out_of_memory():
                raise error
            _warn_out_of_memory(exe, target, report)
            exe.out_of_memory = error  # compiled anyway: a real IPU could not run it
    return exe


def _warn_out_of_memory(exe, target, mem):
    tiles, over, fullest = profile.tile_overflow(exe, target, mem.ipu)
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


def current_workload():
    """The workload set by the caller compiling now (a dict, {} when none):
    for a compiling layer adding what it knows to its caller's."""
    return dict(_WORKLOAD.get() or {})


def announce(exe, context=None):
    """What a newly obtained executable (compiled, or loaded from the disk
    cache) tells the user: --log_cycle_count, and the profile report."""
    exe.workload = _WORKLOAD.get()
    context = context or system_config.configuration()
    if context.flags.log_cycle_count >= 0:
        try:
            exe._prediction = predict(exe, log=True)
        except Exception as e:  # noqa: BLE001 - a diagnostic must not stop the program
            logger.warning("no cycle prediction for %s: %s: %s",
                           exe.name or "program", type(e).__name__, e)
    _write_report(exe)


def predict(exe, log=False, **workload):
    """The Prediction of `exe` on the target it was compiled for."""
    target = exe.target if exe.target is not None else system_config.configuration().target
    workload = {**(getattr(exe, "workload", None) or {}), **workload}
    workload.setdefault("feeds", feeds_of(exe, workload))
    workload.pop("input_categories", None)  # the profile's, not the cost model's
    pipeline = workload.pop("pipeline", None) or getattr(exe, "pipeline", None)
    if pipeline is not None:
        return sharding.predict_pipelined(exe, target, pipeline, log=log, **workload)
    split = getattr(exe, "tensor_parallel", None)
    if split is not None:
        # One IPU's part, the same on each IPU of the axis (they run at once);
        # its inputs are not the split program's (no feeds read from them).
        workload.pop("feeds", None)
        pred = predict_costs(split.local, target, log=log, **workload)
        pred.ipu_cycles = {ipu: pred.cycles for ipu in range(split.ipus)}
        if log:
            logger.info("%s: %s", exe.name or "program", split.partitioned.summary())
        return pred
    return predict_costs(exe, target, log=log, **workload)


def _reported(exe):
    """What the profile report shows of `exe`: itself, or for a program
    split over a mesh axis its one-IPU part (every IPU of the axis runs the
    same part on its blocks), with the split program's memory, workload and
    prediction."""
    split = exe.tensor_parallel
    if split is None:
        return exe
    local = split.local
    local.target, local.workload = exe.target, exe.workload
    local.memory = exe.memory_by_ipu[0]
    local.memory_by_ipu = {0: local.memory}
    local._prediction = exe.prediction
    return local


def _write_report(exe):
    options = profile.report_options()  # bad options: the user's error, raised
    if options is None:
        return None
    try:
        path = profile.write_executable_report(_reported(exe), options,
                                               getattr(exe, "name", None))
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
    if behaviour is None or not behaviour.active:
        return None
    return numerics.wrap_kernel
