"""keras_ipu.ops.embedding_ops: Popops embedding operators. (Graphcore's
`tensorflow.python.ipu.ops.embedding_ops`, also `keras_ipu.embedding_ops`)."""

import math

from keras_ipu.ops import host_embedding
from keras_ipu.ops.math_ops import checked_serialization_factor

_PARTITION_STRATEGIES = ("TOKEN", "ENCODING")


class HostEmbeddingOptimizerSpec:
    """Description of the Host Embedding optimizer: SGD with
    `learning_rate`, applied by the host to the rows the IPU looked up, with
    the gradients the IPU computed (ops/host_embedding.py). Its methods are
    the hooks HostEmbedding calls."""

    def __init__(self, learning_rate, optimizer_name=None):
        if optimizer_name not in (None, "SGD"):
            raise ValueError(f"HostEmbeddingOptimizerSpec optimizer_name={optimizer_name!r}: "
                             "only SGD is supported.")
        self._learning_rate = learning_rate
        self._optimizer_name = optimizer_name or "SGD"

    def get_learning_rate(self):
        return self._learning_rate

    def _accumulation_factor(self):
        return 1

    def create_slot_variables(self, embedding_tensor, name):
        """SGD keeps no slot variables: []."""
        return []

    def create_register_instruction(self, embedding_tensor, slot_vars, name):
        """Give the host `embedding_tensor`'s value to serve (called when
        entering HostEmbedding.register): its host table."""
        return host_embedding.register(name, embedding_tensor)

    def create_deregister_instruction(self, embedding_tensor, slot_vars, name):
        """Write the host's table back to `embedding_tensor` (called when
        leaving HostEmbedding.register)."""
        return host_embedding.deregister(name, embedding_tensor)

    def create_lookup_instruction(self, embedding_tensor, indices, slot_vars,
                                  partition_strategy, name):
        """The rows of the flat `indices`, streamed from the host; their
        gradient goes back to the host, which applies SGD."""
        return host_embedding.streamed_lookup(
            name, indices, embedding_tensor.shape[1], embedding_tensor.dtype,
            trainable=True)


class HostEmbeddingSGDGAOptimizerSpec(HostEmbeddingOptimizerSpec):
    """SGD with gradient accumulation: the host sums the gradients of
    `accumulation_factor` updates and applies them on the last."""

    def __init__(self, learning_rate, accumulation_factor):
        super().__init__(learning_rate)
        if not (isinstance(accumulation_factor, int) and accumulation_factor >= 1):
            raise ValueError(f"accumulation_factor={accumulation_factor!r} must be a "
                             "positive int.")
        self._accumulation_factor_value = accumulation_factor

    def get_accumulation_factor(self):
        return self._accumulation_factor_value

    def _accumulation_factor(self):
        return self._accumulation_factor_value


class HostEmbedding:
    """Host Embedding wrapper: an embedding whose table (rank 2: tokens x
    encoding) stays on the host, looked up by the IPU (see
    ops/host_embedding.py).

    Args:
      name: the name which uniquely identifies the embedding.
      embedding_tensor: the CPU tf.Variable which holds the embedding.
      partition_strategy: "TOKEN" or "ENCODING": how Poplar splits a remote
        buffer embedding over replicas; the values do not depend on it.
      optimizer_spec: a HostEmbeddingOptimizerSpec, or None for an
        embedding that is not trained.
    """

    def __init__(self, name, embedding_tensor, partition_strategy="TOKEN",
                 optimizer_spec=None):
        import tensorflow as tf

        if not isinstance(embedding_tensor, tf.Variable):
            raise ValueError("HostEmbedding embedding_tensor is not a tensorflow variable "
                             f"(got {type(embedding_tensor).__name__}).")
        if embedding_tensor.shape.rank != 2:
            raise ValueError(f"HostEmbedding {name!r}: the embedding must be rank two "
                             f"(tokens x encoding), got shape {embedding_tensor.shape}.")
        if partition_strategy not in _PARTITION_STRATEGIES:
            raise ValueError(f"Unknown partition strategy {partition_strategy!r}: use one "
                             f"of {list(_PARTITION_STRATEGIES)}.")
        if not isinstance(optimizer_spec, (type(None), HostEmbeddingOptimizerSpec)):
            raise ValueError("HostEmbedding optimizer_spec is not a "
                             "HostEmbeddingOptimizerSpec or None")
        self._name = name
        self._embedding_tensor = embedding_tensor
        self._partition_strategy = partition_strategy
        self._optimizer_spec = optimizer_spec
        host_embedding.create_table(
            name, embedding_tensor.dtype,
            None if optimizer_spec is None else optimizer_spec.get_learning_rate(),
            1 if optimizer_spec is None else optimizer_spec._accumulation_factor())  # noqa: SLF001
        self._slot_vars = ([] if optimizer_spec is None
                           else optimizer_spec.create_slot_variables(embedding_tensor, name))

    def get_embedding_tensor(self):
        """The CPU tf.Variable of the embedding (its value is the host's
        table after each registration)."""
        return self._embedding_tensor

    @property
    def trainable_variable(self):
        """The scalar variable through which the lookups' gradients reach
        the host (Graphcore's "__dummy"): differentiate the loss with respect
        to it for the updates to run (TF1 optimizers find it in the
        trainable variables collection). None when not trained."""
        return host_embedding.anchor(self._name)

    def lookup(self, indices, clip_indices=True):
        """The rows of `indices` ([*indices.shape, encoding]), looked up on
        the host while the program runs; with clip_indices the indices are
        clipped into [0, tokens)."""
        import tensorflow as tf

        indices = tf.cast(tf.convert_to_tensor(indices), tf.int32)
        if not indices.shape.is_fully_defined():
            raise ValueError(
                f"HostEmbedding {self._name!r}: the lookup's indices must have a known "
                f"shape (got {indices.shape}): the host streams a fixed number of rows.")
        shape = indices.shape.as_list()
        tokens, encoding = self._embedding_tensor.shape.as_list()
        if clip_indices:
            indices = tf.clip_by_value(indices, 0, tokens - 1)
        flat = tf.reshape(indices, [-1])
        if self._optimizer_spec is None:
            rows = host_embedding.streamed_lookup(self._name, flat, encoding,
                                                  self._embedding_tensor.dtype)
        else:
            rows = self._optimizer_spec.create_lookup_instruction(
                self._embedding_tensor, flat, self._slot_vars, self._partition_strategy,
                self._name)
        return tf.reshape(rows, shape + [encoding])

    def register(self, session=None):
        """A context manager inside which the host serves the embedding to
        the IPU (TensorFlow 2 has no session: `session` may be None); on
        leaving it the host's table is written back to the variable."""
        import contextlib

        spec = self._optimizer_spec or HostEmbeddingOptimizerSpec(0.0)

        @contextlib.contextmanager
        def registration():
            spec.create_register_instruction(self._embedding_tensor, self._slot_vars,
                                             self._name)
            try:
                yield self
            finally:
                spec.create_deregister_instruction(self._embedding_tensor, self._slot_vars,
                                                   self._name)

        return registration()


def create_host_embedding(name, shape, dtype, partition_strategy="TOKEN",
                          optimizer_spec=None, initializer=None):
    """A HostEmbedding of a new CPU variable `name` of `shape` and `dtype`
    (initializer: a tf.keras or tf.compat.v1 initializer, or a value;
    glorot_uniform by default, as Graphcore's get_variable gives floats)."""
    import tensorflow as tf

    with tf.init_scope(), tf.device("/cpu:0"):
        init = initializer or tf.compat.v1.glorot_uniform_initializer()
        value = init(shape, dtype=dtype) if callable(init) else init
        variable = tf.Variable(value, dtype=dtype, name=name, trainable=False)
    return HostEmbedding(name, variable, partition_strategy=partition_strategy,
                         optimizer_spec=optimizer_spec)


def embedding_lookup(params, ids, name=None, serialization_factor=1,
                     one_hot_threshold=0, min_encoding_size=1216):
    """The rows of `params` at `ids`: a [*ids.shape, *params.shape[1:]]
    tensor (tf.nn.embedding_lookup of one table).

    With `serialization_factor` n > 1 the table is cut into n equal blocks
    of rows and looked up block by block, each lookup masked to the ids in
    its block and the n results summed (Graphcore's serialized lookup,
    which saves memory when the table has other users): the same rows, and
    the gradient of the table is the scatter-add of the incoming gradient
    either way. `one_hot_threshold` and `min_encoding_size` are deprecated
    by Graphcore and ignored."""
    import tensorflow as tf

    del one_hot_threshold, min_encoding_size
    serialization_factor = checked_serialization_factor(serialization_factor)
    with tf.name_scope(name or "embedding_lookup"):
        params = tf.convert_to_tensor(params)
        ids = tf.convert_to_tensor(ids)
        rows = params.shape[0]
        if rows % serialization_factor:
            raise ValueError(
                f"The serialization_factor ({serialization_factor}) must divide the size "
                f"of the 0th dimension of params ({rows}).")
        row_shape = params.shape[1:].as_list()
        table = tf.reshape(params, [rows, math.prod(row_shape)])
        flat_ids = tf.reshape(ids, [-1])
        if serialization_factor == 1:
            out = tf.gather(table, flat_ids)
        else:
            block = rows // serialization_factor
            out = None
            for i in range(serialization_factor):
                low = i * block
                local = flat_ids - low
                inside = tf.logical_and(local >= 0, local < block)
                # Ids outside the block read row 0 of it, then are masked out.
                looked_up = tf.gather(table[low:low + block], tf.where(inside, local, 0))
                looked_up = looked_up * tf.cast(inside, table.dtype)[:, None]
                out = looked_up if out is None else out + looked_up
        return tf.reshape(out, tf.concat([tf.shape(ids), row_shape], 0)
                          if ids.shape.rank is None or not ids.shape.is_fully_defined()
                          else ids.shape.as_list() + row_shape)
