"""What an out-of-memory error suggests: only remedies keras_ipu has, only
those that can help with what fills the tile, each with its effect where
the simulator can compute it.

The fullest tile holds two kinds of memory (memory_model.py):
- always live: the program's inputs (weights, optimizer state, and the
  data of one run: the batches of `steps_per_execution` steps, stacked),
  its constants and its code;
- not always live: what the steps make (activations, gradients,
  temporaries), at their peak.
A smaller batch shrinks the data and the activations, never the weights or
the optimizer state: when the always-live memory alone overflows the tile,
the batch is not the remedy, and the message says so.

Callers that know more than the report pass it in an `Advice`: the shares
of the program's inputs (`parts`: weights, optimizer state, data) and
`alternatives`, the same program compiled with one change (a smaller
batch, fewer steps per execution) and what its fullest tile needs, which
the trainer's device loop computes (trainer_ops/memory_advice.py).

Not offered, because keras_ipu does not have them (yet): pipelining or
sharding a Keras model over several IPUs, and availableMemoryProportion
(the memory model has no matmul/convolution working memory for it to
bound).
"""

import dataclasses

from keras_ipu.device.units import fmt_bytes


@dataclasses.dataclass(frozen=True)
class Alternative:
    """The program compiled with one change, and its fullest tile."""

    change: str  # what to do, e.g. "batch_size=8 (half of 16)"
    tile_bytes: int


@dataclasses.dataclass(frozen=True)
class Advice:
    # Bytes on the fullest tile of each kind of program input, in order
    # ("weights", "optimizer state", "data", ...).
    parts: tuple = ()  # ((name, bytes), ...)
    alternatives: tuple = ()  # Alternative
    batch_size: int = None


def _float32_activations(report):
    return any(
        t.aval.dtype.name == "float32" and not t.made_by.startswith("program ")
        for t in report.largest_live
    )


def describe(report, advice=None):
    """The lines of an IPUOutOfMemoryError after the largest tensors: what
    fills the tile, and what to do."""
    advice = advice or Advice()
    capacity = report.tile_capacity
    always = report.tile_always_live_bytes
    peak = report.tile_bytes - always
    # Inputs too small to matter are not listed (metrics, a step counter).
    shown = tuple((n, b) for n, b in advice.parts if b >= 0.01 * max(always, 1))
    parts = dict(advice.parts)
    lines = [
        f"  On tile {report.tile}: always live {fmt_bytes(always)} (program "
        "inputs, constants, code), not always live "
        f"{fmt_bytes(peak)} at the peak (activations, gradients, temporaries)."
    ]
    if shown:
        lines.append(
            "  Program inputs on this tile: "
            + ", ".join(f"{name} {fmt_bytes(n)}" for name, n in shown)
            + "."
        )
    lines.append("  To fit:")
    if always > capacity:
        lines.append(
            f"  - The always-live memory alone needs {fmt_bytes(always)} of "
            f"{fmt_bytes(capacity)}: a smaller batch shrinks only the data and "
            "the activations, not the weights or the optimizer state."
        )
        if parts.get("optimizer state"):
            slots = parts["optimizer state"]
            lines.append(
                f"  - An optimizer with less state: its slots take "
                f"{fmt_bytes(slots)} here (Adam keeps two per weight, SGD with "
                "momentum one, SGD without momentum none); without them the "
                f"tile would need about {_needs(report.tile_bytes - slots, capacity)}."
            )
        if parts.get("weights"):
            lines.append(
                f"  - Fewer or smaller layers: the weights take "
                f"{fmt_bytes(parts['weights'])} here."
            )
    elif peak:
        lines.append(
            "  - A smaller batch size: the activations shrink with it"
            + (" (see below)." if advice.alternatives else ".")
        )
        if _has_recomputation():
            lines.append(
                "  - Recomputation: config.allow_recompute = True before "
                "configure_ipu_system() recomputes activations in the backward "
                "pass instead of keeping them (keras_ipu.layers."
                "RecomputationCheckpoint marks what to keep)."
            )
        if _float32_activations(report):
            lines.append(
                "  - Float16 activations: keras.mixed_precision."
                "set_global_policy('mixed_float16') before building the model "
                "(float32 activations take half the memory; the weights stay "
                "float32)."
            )
    steps_computed = any("steps_per_execution" in a.change for a in advice.alternatives)
    over = report.tile_bytes - capacity
    if parts.get("data", 0) >= 0.1 * over and not steps_computed:
        lines.append(
            f"  - Fewer steps per execution: the data of every step of one "
            f"execution is fed in at once ({fmt_bytes(parts['data'])} here); "
            "compile(steps_per_execution=...) with a smaller number."
        )
    for alt in advice.alternatives:
        lines.append(
            # Its own fullest tile: not necessarily this report's.
            f"  - With {alt.change}, the fullest tile would need "
            f"{_needs(alt.tile_bytes, capacity)} (compiled by the simulator)."
        )
    lines.append(
        "  To look at it anyway: POPLAR_ENGINE_OPTIONS='{\"debug.allowOutOfMemory\": "
        "\"true\"}' compiles it (Poplar's option for this), the profile report "
        "shows which tiles overflow, and the simulator runs it with a warning "
        "(a real IPU could not)."
    )
    return "\n".join(lines)


def _has_recomputation():
    """Whether this keras_ipu has the recomputation pass (and its layer)."""
    import importlib.util

    return (importlib.util.find_spec("keras_ipu.device.compiler.recompute") is not None
            and importlib.util.find_spec("keras_ipu.layers") is not None)


def _needs(nbytes, capacity):
    if nbytes <= capacity:
        return f"{fmt_bytes(nbytes)}: fits"
    return f"{fmt_bytes(nbytes)}: still {fmt_bytes(nbytes - capacity)} over"
