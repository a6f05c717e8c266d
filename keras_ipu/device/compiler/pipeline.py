"""The compile pipeline: Graph -> passes -> Executable.

Order: static-shape check (fail early, on what the user wrote), 64-bit
demotion (so later passes see device dtypes), constant folding, CSE, DCE,
recomputation (when on), elementwise fusion, then liveness and lowering in
the Executable.

Sub-graphs (cond branches, while/scan bodies) are checked for static
shapes and demoted together with the outer program (their signatures must
match it); when the program is lowered they are compiled recursively, with
the same passes, to Executables the control-flow kernels of
compiler/control_flow.py run (no graph interpretation per iteration).
Other primitives holding graphs (remat, custom_vjp) keep their own kernels,
which interpret the sub-graph.

Then the device checks (device_checks.py): the program's memory on the
target it is compiled for, the out-of-memory error, the profile report and
--log_cycle_count. A progress bar follows the stages (progress.py).
"""

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
from keras_ipu.device.compiler import control_flow  # noqa: F401 (lowerings)
from keras_ipu.device.compiler import array_lowering  # noqa: F401 (lowerings)
from keras_ipu.device.compiler import dot_lowering  # noqa: F401 (lowerings)
from keras_ipu.device.compiler.options import CONFIGURED
from keras_ipu.device.compiler.options import CompileOptions
from keras_ipu.device.compiler.recompute import recompute
from keras_ipu.device.compiler.static_shapes import check_static_shapes


def optimize(graph, options=None, notes=None, on_pass=None):
    """The optimized graph, and the list of (pass name, node count).
    `on_pass(name, nodes)` is called after each pass (the progress bar)."""
    options = options or CompileOptions()
    notes = [] if notes is None else notes
    log = [("traced", len(graph.nodes))]
    graph = check_static_shapes(graph)
    if on_pass is not None:
        on_pass("static shapes", _progress.count_nodes(graph))
    if options.demote_64bit:
        graph = demote_64bit(graph, notes)
    if on_pass is not None:
        on_pass("demote 64-bit", _progress.count_nodes(graph))
    steps = [
        (options.fold_constants, "fold_constants",
         lambda g: fold_constants(g, options.fold_limit_bytes)),
        (options.eliminate_common_subexpressions, "cse",
         eliminate_common_subexpressions),
        (options.eliminate_dead_code, "dce", eliminate_dead_code),
        # After CSE and DCE (which would otherwise see the copies), before
        # fusion (which then fuses the copies with their backward readers).
        # Off (None), it removes the checkpoint markers. Loop and branch
        # bodies are rewritten with the program that holds them (their own
        # compile has the recomputation CONFIGURED: nothing to do again).
        (options.recomputation != CONFIGURED, "recompute",
         lambda g: recompute(g, options.recomputation)),
        (options.fuse_elementwise, "fuse",
         lambda g: fuse_elementwise(g, options.donated_inputs)),
    ]
    for enabled, name, fn in steps:
        if enabled:
            graph = fn(graph)
            log.append((name, len(graph.nodes)))
        if on_pass is not None:
            on_pass(name, _progress.count_nodes(graph))
    return graph, log


def compile_graph(graph, options=None, name=None):
    """Compile a Graph to an Executable for the configured IPU (or
    options.target). Warns once if 64-bit values were demoted; raises
    IPUOutOfMemoryError when the program does not fit a tile."""
    context = device_checks.compile_context()
    options = device_checks.resolve_options(options or CompileOptions(), context)
    # jit's bar (opened before tracing) or one of our own.
    bar, owned = _progress.take(context.flags.show_progress_bar, graph, name)
    try:
        notes = []
        optimized, log = optimize(graph, options, notes, on_pass=bar.done)
        if notes:
            warnings.warn(demotion_message(notes), DemotionWarning,
                          stacklevel=user_code.stacklevel())
        exe = Executable(optimized, notes=notes, passes=log,
                         behaviour=options.fp_behaviour, name=name,
                         donated_inputs=options.donated_inputs)
        bar.done("lowering")
        device_checks.check_executable(exe, options.target, context)
        bar.done("memory and cycles")
    finally:
        if owned:
            bar.close()
    return exe
