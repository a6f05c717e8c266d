"""The compile progress bar (TF_POPLAR_FLAGS=--show_progress_bar).

"true" always shows it, "false" never; "auto" (the default) only on an
interactive terminal: at once for a large program (PROGRAM_NODES nodes or
more, sub-graphs included), otherwise only if compiling lasts longer than
AUTO_DELAY_S, so small compiles and test logs stay quiet.

One tick per stage: each compiler pass, lowering, the memory and cycle
analysis.
"""

import sys

from keras_ipu.device.compiler.graph_utils import subgraphs

PROGRAM_NODES = 2000
AUTO_DELAY_S = 1.0


def count_nodes(graph):
    total = 0
    stack = [graph]
    while stack:
        g = stack.pop()
        total += len(g.nodes)
        for node in g.nodes:
            if node.params:
                stack.extend(subgraphs(node.params))
    return total


class _Off:
    def stage(self, name, nodes=None):
        pass

    def close(self):
        pass


OFF = _Off()


class _Bar:
    def __init__(self, bar):
        self._bar = bar

    def stage(self, name, nodes=None):
        self._bar.set_postfix_str(
            name if nodes is None else f"{name} ({nodes} nodes)", refresh=False
        )
        self._bar.update(1)

    def close(self):
        self._bar.close()


def start(mode, graph, stages, name=None, file=None):
    """A progress bar of `stages` ticks for compiling `graph` (OFF when the
    mode says no). `mode` is the --show_progress_bar value."""
    if mode == "false":
        return OFF
    file = sys.stderr if file is None else file
    delay = 0.0
    if mode != "true":
        isatty = getattr(file, "isatty", None)
        if not (isatty and isatty()):
            return OFF
        if count_nodes(graph) < PROGRAM_NODES:
            delay = AUTO_DELAY_S
    try:
        from tqdm import tqdm
    except ImportError:  # the bar is a convenience; compiling goes on
        return OFF
    bar = tqdm(
        total=stages,
        desc=f"Compiling {name or 'program'}",
        unit="stage",
        file=file,
        delay=delay,
        leave=mode == "true",
        dynamic_ncols=True,
    )
    return _Bar(bar)
