"""keras_ipu.ops.embedding_ops: Popops embedding operators. (Graphcore's
`tensorflow.python.ipu.ops.embedding_ops`, also `keras_ipu.embedding_ops`)."""

from keras_ipu._unavailable import unavailable_class
from keras_ipu._unavailable import unavailable_function

_PLANNED = "not implemented yet (issue 12)."

HostEmbedding = unavailable_class("embedding_ops.HostEmbedding", _PLANNED)
HostEmbeddingOptimizerSpec = unavailable_class("embedding_ops.HostEmbeddingOptimizerSpec", _PLANNED)
HostEmbeddingSGDGAOptimizerSpec = unavailable_class("embedding_ops.HostEmbeddingSGDGAOptimizerSpec", _PLANNED)
create_host_embedding = unavailable_function("embedding_ops.create_host_embedding", _PLANNED)
embedding_lookup = unavailable_function("embedding_ops.embedding_lookup", _PLANNED)
