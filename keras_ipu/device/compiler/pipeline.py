"""The compile pipeline: Graph -> passes -> Executable.

Order: static-shape check (fail early, on what the user wrote), 64-bit
demotion (so later passes see device dtypes), constant folding, CSE, DCE,
elementwise fusion, then liveness and lowering in the Executable.

Sub-graphs (cond branches, while/scan bodies) are checked for static
shapes and demoted together with the outer program (their signatures must
match it); when the program is lowered they are compiled recursively, with
the same passes, to Executables the control-flow kernels of
compiler/control_flow.py run (no graph interpretation per iteration).
Other primitives holding graphs (remat, custom_vjp) keep their own kernels,
which interpret the sub-graph.
"""

import warnings

from keras_ipu.device.compiler.common_subexpressions import (
    eliminate_common_subexpressions,
)
from keras_ipu.device.compiler.constant_folding import fold_constants
from keras_ipu.device.compiler.dead_code import eliminate_dead_code
from keras_ipu.device.compiler.demotion import DemotionWarning
from keras_ipu.device.compiler.demotion import demote_64bit
from keras_ipu.device.compiler.demotion import demotion_message
from keras_ipu.device.compiler.executable import Executable
from keras_ipu.device.compiler.fusion import fuse_elementwise
from keras_ipu.device.compiler import control_flow  # noqa: F401 (lowerings)
from keras_ipu.device.compiler import array_lowering  # noqa: F401 (lowerings)
from keras_ipu.device.compiler import dot_lowering  # noqa: F401 (lowerings)
from keras_ipu.device.compiler.options import CompileOptions
from keras_ipu.device.compiler.static_shapes import check_static_shapes


def optimize(graph, options=None, notes=None):
    """The optimized graph, and the list of (pass name, node count)."""
    options = options or CompileOptions()
    notes = [] if notes is None else notes
    log = [("traced", len(graph.nodes))]
    graph = check_static_shapes(graph)
    if options.demote_64bit:
        graph = demote_64bit(graph, notes)
    steps = [
        (options.fold_constants, "fold_constants",
         lambda g: fold_constants(g, options.fold_limit_bytes)),
        (options.eliminate_common_subexpressions, "cse",
         eliminate_common_subexpressions),
        (options.eliminate_dead_code, "dce", eliminate_dead_code),
        (options.fuse_elementwise, "fuse", fuse_elementwise),
    ]
    for enabled, name, fn in steps:
        if enabled:
            graph = fn(graph)
            log.append((name, len(graph.nodes)))
    return graph, log


def compile_graph(graph, options=None):
    """Compile a Graph to an Executable. Warns once if 64-bit values were
    demoted."""
    notes = []
    optimized, log = optimize(graph, options, notes)
    if notes:
        warnings.warn(demotion_message(notes), DemotionWarning, stacklevel=3)
    return Executable(optimized, notes=notes, passes=log)
