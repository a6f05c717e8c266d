"""Run by tests/distributed/test_multiprocess.py: ipu.distributed's ops on
TensorFlow values, eagerly and inside a tf.function (host code), written
as JSON to OUT_DIR/instance-<i>.json."""

import json
import os
import sys

import tensorflow as tf

from keras_ipu import distributed as hvd

hvd.init()
rank = hvd.rank()
x = tf.constant([1.0, 2.0]) * (rank + 1)
v = tf.Variable([10.0 * (rank + 1)])


@tf.function
def graph_sum(t):
    return hvd.allreduce(t, op=hvd.Sum)


slices = tf.IndexedSlices(
    values=tf.constant([[float(rank)]]), indices=tf.constant([rank]), dense_shape=tf.constant([2, 1])
)
reduced_slices = hvd.allreduce(slices, op=hvd.Sum)
result = {
    "eager_type": type(hvd.allreduce(x)).__name__,
    "average": hvd.allreduce(x).numpy().tolist(),
    "variable_broadcast": hvd.broadcast(v, root_rank=0).numpy().tolist(),
    "graph_sum": graph_sum(x).numpy().tolist(),
    "slices": [reduced_slices.values.numpy().tolist(), reduced_slices.indices.numpy().tolist()],
}
with open(os.path.join(sys.argv[1], f"instance-{rank}.json"), "w") as f:
    json.dump(result, f)
