"""An out-of-memory error of a fit/evaluate/predict program, with advice
the simulator computed for it (device/simulator/memory_remedies.py).

The device loop knows what the program's inputs are (the model's state by
kind, then the stacked batches), so it can say how much of the fullest
tile the weights, the optimizer state and the data take, and it can
compile the same loop with one change: half the batch (a few times, until
it fits), one step per execution. Each alternative costs one compile, on
the error path only.
"""

import time

import numpy as np

from keras_ipu.device.compiler.cache import ExecutableCache
from keras_ipu.device.jit import Jitted
from keras_ipu.device.simulator import memory_model
from keras_ipu.device.simulator.memory_model import IPUOutOfMemoryError
from keras_ipu.device.simulator.memory_remedies import Advice
from keras_ipu.device.simulator.memory_remedies import Alternative

_NAMES = {
    "trainable": "weights",
    "non_trainable": "non-trainable weights",
    "optimizer": "optimizer state",
    "metrics": "metrics",
}
# Compiles spent on alternatives stop after this long (a large model
# compiles for seconds).
_BUDGET_SECONDS = 20.0
_HALVINGS = 3


def _tile_share(avals, tiles):
    return sum(memory_model.tile_bytes(a, tiles) for a in avals)


def _parts(exe, report, state_sizes, state_kinds):
    avals = list(exe.in_avals)
    tiles = report.tiles
    parts, start = [], 0
    for kind, size in zip(state_kinds, state_sizes):
        share = _tile_share(avals[start:start + size], tiles)
        if share:
            parts.append((_NAMES.get(kind, kind), share))
        start += size
    data = _tile_share(avals[sum(state_sizes):], tiles)
    if data:
        parts.append(("data", data))
    return tuple(parts)


def _needs(probe, state, stacked):
    """The fullest tile's bytes of the loop compiled for `stacked`."""
    try:
        return probe.executable(state, stacked).memory.tile_bytes
    except IPUOutOfMemoryError as e:
        return e.report.tile_bytes


def _probe(loop):
    """The jitted loop again, compiling into a cache of its own (no disk
    entries, no place taken in the process' cache, no recompile count)."""
    return Jitted(loop.fn, options=loop.options, donate_argnums=loop.donate_argnums,
                  cache=ExecutableCache(capacity=1, disk=False))


def _alternatives(loop, state, stacked, capacity, fixed):
    """Compiled alternatives; none when what stays whatever the data
    (`fixed`: always-live bytes besides the data) overflows already."""
    found = []
    if fixed > capacity:
        return ()
    loop = _probe(loop)
    deadline = time.monotonic() + _BUDGET_SECONDS
    steps = stacked[0].shape[0] if stacked and stacked[0].ndim else 1
    if steps > 1:
        needs = _needs(loop, state, [a[:1] for a in stacked])
        found.append(Alternative(f"steps_per_execution=1 (not {steps})", needs))
    batch = stacked[0].shape[1] if stacked and stacked[0].ndim > 1 else None
    if batch and all(a.ndim > 1 and a.shape[1] == batch for a in stacked):
        smaller, previous = batch, float("inf")
        for _ in range(_HALVINGS):
            smaller //= 2
            if smaller < 1 or time.monotonic() > deadline:
                break
            needs = _needs(loop, state, [np.ascontiguousarray(a[:, :smaller]) for a in stacked])
            found.append(Alternative(f"batch_size={smaller} (not {batch})", needs))
            if needs <= capacity or needs >= 0.99 * previous:
                break  # fits, or the batch is not what fills the tile
            previous = needs
    return tuple(found)


def explain_out_of_memory(error, loop, state, stacked, state_kinds=()):
    """`error` raised again with the advice of this device loop."""
    exe = getattr(error, "executable", None)
    report = error.report
    sizes = [len(group) for group in state] if state_kinds else []
    parts = _parts(exe, report, sizes, state_kinds) if exe is not None and sizes else ()
    fixed = report.tile_always_live_bytes - dict(parts).get("data", 0)
    try:
        alternatives = _alternatives(loop, state, stacked, report.tile_capacity, fixed)
    except Exception:  # noqa: BLE001 - advice must not hide the error
        alternatives = ()
    batch = stacked[0].shape[1] if stacked and stacked[0].ndim > 1 else None
    better = IPUOutOfMemoryError(report, Advice(parts, alternatives, batch))
    better.executable = exe
    return better
