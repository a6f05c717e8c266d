"""keras_ipu.ops.embedded_runtime: The embedded application runtime. (Graphcore's
`tensorflow.python.ipu.ops.embedded_runtime`, also `keras_ipu.embedded_runtime`)."""

from keras_ipu._unavailable import PLANNED
from keras_ipu._unavailable import declare_unavailable

declare_unavailable(
    globals(), "embedded_runtime", PLANNED,
    classes=("RuntimeContext",),
    functions=(
        "embedded_runtime_call", "embedded_runtime_start", "embedded_runtime_start_and_call",
        "embedded_runtime_stop"
    ),
)
