"""The compile pipeline: Graph -> passes -> Executable.

Order: static-shape check (fail early, on what the user wrote), 64-bit
demotion (so later passes see device dtypes), constant folding, CSE, DCE,
scan splitting, recomputation (when on), placement on IPUs (when the
options have one; before fusion, which keeps a chain on one IPU),
elementwise fusion, then liveness and lowering in the Executable.

Sub-graphs (cond branches, while/scan bodies) are checked for static
shapes and demoted together with the outer program (their signatures must
match it); then they are compiled (`build_executable`), with the outer
program's options (`body_options`), to Executables the control-flow
kernels of compiler/control_flow.py run (no graph interpretation per
iteration). Other primitives holding graphs (remat, custom_vjp) keep their
own kernels, which interpret the sub-graph.

Then the device checks (device_checks.py): the program's memory on the
target it is compiled for, the out-of-memory error, the profile report and
--log_cycle_count. A progress bar follows the stages (progress.py).
"""

import dataclasses
import warnings

from keras_ipu.device import user_code

from keras_ipu.device.compiler.common_subexpressions import (
    eliminate_common_subexpressions,
)
from keras_ipu.device.compiler.constant_folding import fold_constants
from keras_ipu.device.compiler.dead_code import eliminate_dead_code
from keras_ipu.device.compiler.demotion import DemotionWarning
from keras_ipu.device.compiler.demotion import demote_64bit
from keras_ipu.device.compiler.demotion import demotion_message
from keras_ipu.device.compiler import device_checks
from keras_ipu.device.compiler import progress as _progress
from keras_ipu.device.compiler.executable import Executable
from keras_ipu.device.compiler.fusion import fuse_elementwise
from keras_ipu.device.compiler import control_flow
from keras_ipu.device.compiler import array_lowering  # noqa: F401 (lowerings)
from keras_ipu.device.compiler import dot_lowering  # noqa: F401 (lowerings)
from keras_ipu.device.compiler import pooling_lowering  # noqa: F401 (lowerings)
from keras_ipu.device.compiler.options import CONFIGURED
from keras_ipu.device.compiler.options import CompileOptions
from keras_ipu.device.compiler.placement import place
from keras_ipu.device.compiler.recompute import recompute
from keras_ipu.device.compiler.scan_splitting import split_scans
from keras_ipu.device.compiler import tensor_parallel
from keras_ipu.device.compiler.static_shapes import check_static_shapes
from keras_ipu.device.config import system_config


def _passes(options, notes):
    """(name, enabled, pass) in the order of the progress bar's stages
    (progress.STAGES, between tracing and lowering); each pass maps a Graph
    to a Graph."""
    passes = {
        "static shapes": (True, check_static_shapes),
        "demote 64-bit": (options.demote_64bit, lambda g: demote_64bit(g, notes)),
        "fold_constants": (options.fold_constants,
                           lambda g: fold_constants(g, options.fold_limit_bytes)),
        "cse": (options.eliminate_common_subexpressions, eliminate_common_subexpressions),
        "dce": (options.eliminate_dead_code, eliminate_dead_code),
        # After DCE pruned the scans of what autodiff stacked for nothing.
        "split scans": (options.split_scans, split_scans),
        # After CSE and DCE (which would otherwise see the copies), before
        # placement (a copy runs where the forward node it repeats does) and
        # fusion (which then fuses the copies with their backward readers).
        # Off (None), it removes the checkpoint markers. Loop and branch
        # bodies are rewritten with the program that holds them (their own
        # compile has the recomputation CONFIGURED: nothing to do again).
        "recompute": (options.recomputation != CONFIGURED,
                      lambda g: recompute(g, options.recomputation)),
        "place": (options.placement is not None, lambda g: place(g, options.placement)),
        "fuse": (options.fuse_elementwise,
                 lambda g: fuse_elementwise(g, options.donated_inputs)),
    }
    return tuple((name, *passes[name]) for name in _progress.STAGES[1:-2])


def optimize(graph, options=None, notes=None, on_pass=None):
    """The optimized graph, and the list of (pass name, node count) of the
    passes that ran ("traced": before them). `on_pass(name, nodes)` is
    called after each pass, run or not (the progress bar)."""
    options = options or CompileOptions()
    notes = [] if notes is None else notes
    log = [("traced", len(graph.nodes))]
    for name, enabled, fn in _passes(options, notes):
        if enabled:
            graph = fn(graph)
            log.append((name, len(graph.nodes)))
        if on_pass is not None:
            on_pass(name, _progress.count_nodes(graph))
    return graph, log


def body_options(options, donated_inputs=()):
    """The options a cond branch or loop body is compiled with: the outer
    program's, without the demotion, the recomputation and the placement
    (done with the outer program: a body's signature must match it, and
    those passes rewrote and placed the bodies' nodes) and the pipeline
    schedule (the outer program's prediction applies it), and with the
    body's own donated inputs."""
    return dataclasses.replace(options, demote_64bit=False, recomputation=CONFIGURED,
                               placement=None, pipeline=None, tensor_parallel=None,
                               donated_inputs=tuple(donated_inputs))


def _fused(graph, options, log):
    if not options.fuse_elementwise:
        return graph
    graph = fuse_elementwise(graph, options.donated_inputs)
    log.append(("fuse", len(graph.nodes)))
    return graph


def _body_compiler(options, finish):
    """compile_body for control_flow.compile_bodies: a body optimized with
    body_options(options), then finish(optimized, its options, pass log)."""

    def compile_body(body, donated_inputs=()):
        inner = body_options(options, donated_inputs)
        optimized, log = optimize(body, inner)
        return finish(optimized, inner, log)

    return compile_body


def running_graph(graph, options=None):
    """An optimized `graph` with its control-flow bodies optimized as
    build_executable compiles them (body_options, every level), without
    lowering anything: the program its executable runs
    (Executable.running_graph), for the prediction of a traced program
    that is not compiled (models/prediction.py). `options`: those `graph`
    was optimized with."""
    compile_body = _body_compiler(
        options or CompileOptions(), lambda body, inner, log: running_graph(body, inner))
    return control_flow.with_bodies(graph, control_flow.compile_bodies(graph, compile_body))


def build_executable(graph, options, notes=(), passes=(), name=None):
    """The Executable of an optimized `graph`; its control-flow bodies are
    optimized and compiled first, with body_options(options)."""
    compile_body = _body_compiler(
        options, lambda body, inner, log: build_executable(body, inner, passes=log))
    return Executable(graph, notes=notes, passes=passes, behaviour=options.fp_behaviour,
                      name=name, donated_inputs=options.donated_inputs,
                      subprograms=control_flow.compile_bodies(graph, compile_body))


def compile_graph(graph, options=None, name=None):
    """Compile a Graph to an Executable for the configured IPU (or
    options.target). Warns once if 64-bit values were demoted; raises
    IPUOutOfMemoryError when the program does not fit a tile."""
    context = system_config.configuration()
    options = device_checks.resolve_options(options or CompileOptions(), context)
    # jit's bar (opened before tracing) or one of our own.
    bar, owned = _progress.take(context.flags.show_progress_bar, graph, name)
    try:
        notes = []
        split = options.tensor_parallel
        if split is not None and (options.placement is not None or options.pipeline is not None):
            raise NotImplementedError(
                "A program split over the IPUs of a keras.distribution mesh axis (tensor "
                "parallelism) cannot also be placed in pipeline stages or shards: the "
                "simulator predicts one or the other. Use a LayoutMap without "
                "PipelineStage / set_pipeline_stage_assignment, or pipeline without it.")
        # A split program is partitioned before fusion (the rules are the
        # primitives'), then both programs are fused the same way.
        unfused = options if split is None else dataclasses.replace(
            options, fuse_elementwise=False)
        optimized, log = optimize(graph, unfused, notes, on_pass=bar.done)
        if notes:
            warnings.warn(demotion_message(notes), DemotionWarning, 
                          stacklevel=user_code.stacklevel())
        if split is not None:
            partitioned = tensor_parallel.partition(optimized, split)
            optimized = _fused(optimized, options, log)
        exe = build_executable(optimized, options, notes=notes, passes=log, name=name)
        if split is not None:
            exe.tensor_parallel = tensor_parallel.SplitProgram(
                partitioned, build_executable(_fused(partitioned.local, options, []),
                                              body_options(options, options.donated_inputs),
                                              name=name))
        bar.done("lowering")
        device_checks.check_executable(exe, options.target, context, options.pipeline)
        bar.done("memory and cycles")
    finally:
        if owned:
            bar.close()
    return exe
