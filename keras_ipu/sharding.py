"""keras_ipu.sharding: Graphcore's `tensorflow.python.ipu.sharding`."""

from keras_ipu._unavailable import PLANNED
from keras_ipu._unavailable import declare_unavailable

declare_unavailable(
    globals(), "sharding", PLANNED,
    functions=(
        "dependencies", "enable_sharded_gradient_tape", "get_shard_from_colocation", "get_sharding",
        "has_attr", "propagate_sharding",
    ),
)
