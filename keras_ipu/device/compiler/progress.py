"""The compile progress bar (TF_POPLAR_FLAGS=--show_progress_bar).

"true" always shows it, "false" never; "auto" (the default) only on an
interactive terminal: at once for a large program (PROGRAM_NODES nodes or
more, sub-graphs included), otherwise only if compiling lasts longer than
AUTO_DELAY_S, so small compiles and test logs stay quiet.

One tick per stage (STAGES: tracing, each compiler pass, lowering, the
memory and cycle analysis); the bar names the stage that is running now
and the node count of the program so far (sub-graphs included). On a
terminal it is a tqdm bar; where the output is not a terminal ("true" into
a log file) or the terminal reports no width, it prints one plain line per
stage instead of redrawing.

jit opens the bar before tracing (`compiling(...)`); compile_graph
continues the bar that is open, or opens its own when called directly.
"""

import contextlib
import contextvars
import os
import sys
import time

from keras_ipu.device.ir import subgraphs

PROGRAM_NODES = 2000
AUTO_DELAY_S = 1.0
# The stages of a compile, in order: tracing, the compiler's passes (the
# pipeline runs them in this order: pipeline._passes), lowering, the memory
# and cycle analysis.
STAGES = ("tracing", "static shapes", "demote 64-bit", "fold_constants", "cse",
          "dce", "split scans", "recompute", "place", "fuse", "lowering", "memory and cycles")
MIN_COLUMNS = 40  # narrower than this (or 0): plain lines, not a bar
_CURRENT = contextvars.ContextVar("keras_ipu_progress", default=None)


def count_nodes(graph):
    total = 0
    stack = [graph]
    while stack:
        g = stack.pop()
        total += len(g.nodes)
        for node in g.nodes:
            stack.extend(subgraphs(node))
    return total


class _Off:
    def running(self, name):
        pass

    def done(self, name, nodes=None):
        pass

    def stage(self, name, nodes=None):
        pass

    def close(self, note=None):
        pass


OFF = _Off()


class _Progress:
    """Stages in order; `done(name, nodes)` ticks and names the next one."""

    def __init__(self, name, stages):
        self.name = name or "program"
        self.stages = tuple(stages)
        self.finished = 0
        self.nodes = None
        self.start = time.perf_counter()

    def _next(self):
        return self.stages[self.finished] if self.finished < len(self.stages) else None

    def _status(self):
        running = self._next()
        nodes = f"{self.nodes:,} nodes" if self.nodes is not None else ""
        if running is None:
            return f"done ({nodes})" if nodes else "done"
        return f"running: {running}" + (f" ({nodes} so far)" if nodes else "")

    def running(self, name):
        """Says `name` runs now (a stage that is not next in STAGES)."""
        if name in self.stages[self.finished:]:
            self.finished = self.stages.index(name, self.finished)
        self._show()

    def done(self, name, nodes=None):
        if nodes is not None:
            self.nodes = nodes
        if name in self.stages[self.finished:]:
            self.finished = self.stages.index(name, self.finished) + 1
        else:
            self.finished = min(self.finished + 1, len(self.stages))
        self._show()

    stage = done  # the compiler's on_pass(name, nodes) callback

    def close(self, note=None):
        if note is None and self.finished < len(self.stages):
            note = "stopped"
        self._close(note)


class _Bar(_Progress):
    def __init__(self, name, stages, tqdm_bar, large):
        super().__init__(name, stages)
        self._bar = tqdm_bar
        self._large = large

    def _show(self):
        bar = self._bar
        if self._large(self.nodes):
            bar.delay = 0  # a large program: show it now, not after the delay
        bar.set_postfix_str(self._status(), refresh=False)
        bar.update(self.finished - bar.n)

    def _close(self, note):
        if note:
            self._bar.set_postfix_str(note, refresh=False)
        self._bar.close()


class _Lines(_Progress):
    """One line per stage, for output that is not a terminal."""

    def __init__(self, name, stages, file):
        super().__init__(name, stages)
        self._file = file
        self._write(f"Compiling {self.name}: {self._status()}")

    def _write(self, text):
        self._file.write(text + "\n")
        self._file.flush()

    def _show(self):
        self._write(f"Compiling {self.name}: [{self.finished}/{len(self.stages)}] "
                    f"{self._status()}")

    def _close(self, note):
        seconds = time.perf_counter() - self.start
        self._write(f"Compiling {self.name}: {note or 'done'} in {seconds:.1f} s")


def _columns(file):
    try:
        return os.get_terminal_size(file.fileno()).columns
    except (AttributeError, OSError, ValueError):
        return 0


def start(mode, graph=None, stages=STAGES, name=None, file=None):
    """A progress bar of `stages` for compiling `graph` (None: not traced
    yet), or OFF when the mode says no. `mode`: the --show_progress_bar
    value. `stages`: names, or a count (unnamed stages)."""
    if mode == "false":
        return OFF
    if isinstance(stages, int):
        stages = tuple(f"stage {k + 1}" for k in range(stages))
    file = sys.stderr if file is None else file
    isatty = getattr(file, "isatty", None)
    terminal = bool(isatty and isatty())
    if mode != "true" and not terminal:
        return OFF
    nodes = count_nodes(graph) if graph is not None else None
    columns = _columns(file) if terminal else 0
    if terminal and 0 < columns < MIN_COLUMNS or mode == "true" and not terminal:
        return _Lines(name, stages, file)
    try:
        from tqdm import tqdm
    except ImportError:  # the bar is a convenience; compiling goes on
        return OFF

    def large(n):
        return mode == "true" or (n is not None and n >= PROGRAM_NODES)

    bar = tqdm(
        total=len(stages),
        desc=f"Compiling {name or 'program'}",
        unit="stage",
        file=file,
        delay=0.0 if large(nodes) else AUTO_DELAY_S,
        leave=mode == "true",
        mininterval=0,  # a handful of stages: draw each as it starts
        # A terminal that reports no width (0 columns) gets a fixed one.
        dynamic_ncols=columns > 0,
        ncols=None if columns > 0 else 80,
    )
    progress = _Bar(name, stages, bar, large)
    progress.nodes = nodes
    progress._show()
    return progress


def current():
    """The bar jit opened for the compile in progress, or None."""
    return _CURRENT.get()


def take(mode, graph, name=None):
    """(bar, owned) for compile_graph: the bar jit opened (taken, so that
    programs compiled inside, such as loop bodies, do not tick it), or a
    new one of the stages after tracing that the caller closes."""
    bar = _CURRENT.get()
    if bar is not None:
        _CURRENT.set(None)
        return bar, False
    return start(mode, graph, STAGES[1:], name), True


@contextlib.contextmanager
def compiling(mode, name=None, file=None):
    """The bar of one compile, from tracing on: jit traces inside, and
    compile_graph (or a cache hit) finishes it."""
    bar = start(mode, None, STAGES, name, file)
    token = _CURRENT.set(bar)
    try:
        yield bar
    except BaseException:
        _CURRENT.reset(token)
        bar.close("failed")
        raise
    _CURRENT.reset(token)
    bar.close(None if getattr(bar, "finished", len(STAGES)) >= len(STAGES)
              else "loaded from the executable cache")
