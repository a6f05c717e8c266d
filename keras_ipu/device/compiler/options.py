"""Compile options: which passes run and their limits, and what the program
is compiled for (the IPU target and the floating-point behaviour). Part of
the cache key, so executables compiled with different options, or for
another IPU, never mix."""

import dataclasses
import enum

# fp_behaviour's default: the behaviour of the configured system, read when
# compiling (device_checks.resolve_options). None would be ambiguous: it is
# the resolved value of "everything off".
CONFIGURED = "configured"


@dataclasses.dataclass(frozen=True)
class CompileOptions:
    fold_constants: bool = True
    # A constant-folded value bigger than this stays a computation: baking a
    # huge array into the executable costs memory on every tile it lives on.
    fold_limit_bytes: int = 1 << 20
    eliminate_common_subexpressions: bool = True
    eliminate_dead_code: bool = True
    # Products in scan bodies that need no other step's result run once
    # over all steps, outside the loop (scan_splitting.py).
    split_scans: bool = True
    fuse_elementwise: bool = True
    # IPU rule: no 64-bit floats/ints on the device.
    demote_64bit: bool = True
    # The IPU the program is compiled for (an IPUTarget, or its name such as
    # "ipu21"). None: the configured system's (one ipu2 IPU Model when
    # nothing is configured). Memory, cycles and the out-of-memory check
    # are for this target.
    target: object = None
    # The floating-point behaviour (inv, div0, oflo, esr, nanoo) the kernels
    # are built with; fixed at compile time, as on the IPU.
    fp_behaviour: object = CONFIGURED
    # Positions of the flat inputs the caller gives up (donation.py): the
    # program may overwrite them, as jax.jit's donate_argnums. The trainer
    # donates the model state it replaces with the step's results.
    donated_inputs: tuple = ()
    # Where the program runs (placement.Placement: the pipeline stage of
    # each Keras layer path, the IPU of each stage); None: one IPU.
    placement: object = None
    # Recomputation of forward activations in the backward pass
    # (recompute.py): a recompute.RecomputationMode, None for none, or
    # CONFIGURED: Auto when the configured IPUConfig has allow_recompute.
    recomputation: object = CONFIGURED
    # A pipelined program's schedule (simulator/sharding.Pipelining: the
    # schedule, micro-batches per step, offloaded optimizer state): its
    # prediction and memory per IPU follow it (device_checks); its values
    # never do. In the key, so that each executable has one prediction.
    pipeline: object = None
    # A program split over the IPUs of a keras.distribution mesh axis
    # (tensor_parallel.TensorParallel: the split dimension of each split
    # input): its prediction and memory per IPU are those of one IPU's part
    # (device_checks); its values never change. None: not split.
    tensor_parallel: object = None

    def cache_key(self):
        return repr(
            tuple((f.name, _stable(getattr(self, f.name)))
                  for f in dataclasses.fields(self))
        )


def _stable(value):
    """A repr that is the same in every process (sets are sorted), so the
    disk cache keys agree across runs."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return tuple((f.name, _stable(getattr(value, f.name)))
                     for f in dataclasses.fields(value))
    if isinstance(value, enum.Enum):
        return f"{type(value).__name__}.{value.name}"
    if isinstance(value, dict):
        return tuple(sorted((repr(k), _stable(v)) for k, v in value.items()))
    if isinstance(value, (set, frozenset)):
        return tuple(sorted(repr(_stable(v)) for v in value))
    if isinstance(value, (tuple, list)):
        return tuple(_stable(v) for v in value)
    return repr(value)
