"""keras_ipu.ops.embedding_ops: Popops embedding operators. (Graphcore's
`tensorflow.python.ipu.ops.embedding_ops`, also `keras_ipu.embedding_ops`)."""

from keras_ipu._unavailable import PLANNED
from keras_ipu._unavailable import declare_unavailable

declare_unavailable(
    globals(), "embedding_ops", PLANNED,
    classes=("HostEmbedding", "HostEmbeddingOptimizerSpec", "HostEmbeddingSGDGAOptimizerSpec"),
    functions=("create_host_embedding", "embedding_lookup"),
)
