"""The functional pipelines a traced TensorFlow program holds.

pipelining_ops.pipeline runs while the TensorFlow front end traces a
function for the IPU; it records here what the XLA program cannot carry
(the IPU of each stage, the schedule, micro-batches per weight update,
the recomputation mode), so that the imported program can be placed and
simulated as the Keras pipelines are.

    with recording() as runs:      # the front end, around a trace
        ...                        # pipelining_ops.pipeline(...) appends
"""

import contextlib
import dataclasses
import threading

_state = threading.local()


@dataclasses.dataclass(frozen=True)
class PipelineRun:
    """One pipelining_ops.pipeline call of a traced program."""

    device_mapping: tuple  # IPU of stage k (its ops are in the name scope of stage k)
    schedule: object  # PipelineSchedule
    gradient_accumulation_count: int
    repeat_count: int
    recomputation_mode: object  # RecomputationMode
    training: bool
    # Micro-batches each stage runs in a loop per pipeline iteration (a
    # weight update accumulates gradient_accumulation_count x this many).
    batch_serialization_iterations: int = 1


def record_pipeline(run):
    """Note `run` for the trace being recorded (outside any recording, as
    when TensorFlow traces the function for itself, nothing is kept)."""
    runs = getattr(_state, "runs", None)
    if runs is not None:
        runs.append(run)


@contextlib.contextmanager
def recording():
    """Collect the PipelineRuns of the code run inside (a list)."""
    outer = getattr(_state, "runs", None)
    _state.runs = runs = []
    try:
        yield runs
    finally:
        _state.runs = outer
