"""Run by tests/distributed/test_multiprocess.py in every instance of a
job: a Keras model without batch statistics trained with fit in the scope
of a multi-process strategy (argv[3]: popdist, the default, horovod or
multiworker) on this instance's share of one fixed data set; each instance
writes its final weights and losses to OUT_DIR (argv[1]). argv[2]: the
replicated metric reduction method.

The data set is dealt as Graphcore's infeed deals it on one process of R
replicas (batch t * R + r is global replica r's step t): instance i takes,
of every R consecutive batches, the L of its replicas (its offset ... + L).
"""

import json
import os
import sys

import numpy as np

os.environ.setdefault("KERAS_BACKEND", "ipu")

import keras  # noqa: E402

import keras_ipu.popdist.tensorflow  # noqa: E402
from keras_ipu import popdist  # noqa: E402
from keras_ipu.config import IPUConfig  # noqa: E402
from keras_ipu import ipu_multi_worker_strategy  # noqa: E402
from keras_ipu.distributed.ipu_horovod_strategy import IPUHorovodStrategy  # noqa: E402
from keras_ipu.distributed.popdist_strategy import PopDistStrategy  # noqa: E402

BATCH = 4  # per replica
STEPS = 6

out = sys.argv[1]
reduction = sys.argv[2] if len(sys.argv) > 2 else "NONE"
kind = sys.argv[3] if len(sys.argv) > 3 else "popdist"
if kind == "popdist":
    config = keras_ipu.popdist.tensorflow.set_ipu_config(IPUConfig())
    config.configure_ipu_system()
    strategy = PopDistStrategy()
else:
    # Horovod-style strategies reduce over every process whatever the
    # IPUConfig says: a plain one-device config per process.
    config = IPUConfig()
    config.auto_select_ipus = popdist.getNumLocalReplicas()
    config.configure_ipu_system()
    if kind == "horovod":
        strategy = IPUHorovodStrategy()
    else:
        resolver = ipu_multi_worker_strategy.TFConfigClusterResolver()
        strategy = ipu_multi_worker_strategy.IPUMultiWorkerStrategy(resolver)

total, local = popdist.getNumTotalReplicas(), popdist.getNumLocalReplicas()
offset = popdist.getReplicaIndexOffset()
rng = np.random.default_rng(7)
x = rng.normal(size=(STEPS * total * BATCH, 5)).astype(np.float32)
y = (x @ rng.normal(size=(5, 1)) + 0.1).astype(np.float32)
# (steps, replicas, batch, ...) -> this instance's replicas, back in infeed order.
mine = lambda a: a.reshape(STEPS, total, BATCH, -1)[:, offset:offset + local].reshape(-1, a.shape[-1])

keras.utils.set_random_seed(1 + popdist.getInstanceIndex())  # rank 0's weights are broadcast
with strategy.scope():
    model = keras.Sequential(
        [keras.Input((5,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(1)]
    )
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse", steps_per_execution=STEPS)
    model.set_replication_options(replicated_metric_reduction_method=reduction)
    # Every step's callbacks, with that step's logs (reduced as the epoch's).
    model.set_asynchronous_callbacks(True)
    step_losses = []
    record = keras.callbacks.LambdaCallback(
        on_train_batch_end=lambda batch, logs: step_losses.append(float(logs["loss"])))
    history = model.fit(mine(x), mine(y), batch_size=BATCH, epochs=2, shuffle=False, verbose=0,
                        callbacks=[record])

with strategy.scope():
    # Random state: broadcast from instance 0, then moved to this instance's
    # first replica (predict starts with the broadcast).
    dropout = keras.Sequential([keras.Input((2,)), keras.layers.Dropout(0.5, seed=11)])
    dropout.compile()
    dropout.predict(np.ones((4 * local, 2), np.float32), batch_size=4, verbose=0)
seed_state = [np.asarray(v.value).tolist() for v in dropout.variables if "seed" in v.name]

# strategy.extended.read_var: a sync-on-read variable holds this instance's
# part and is read as its aggregate over the instances (read by all at once).
rank = popdist.getInstanceIndex()
read_var = {}
with strategy.scope():
    for aggregation in ("sum", "mean", "only_first_replica"):
        variable = keras.Variable(float(rank + 1), synchronization="on_read", aggregation=aggregation)
        read_var[aggregation] = float(strategy.extended.read_var(variable))
    read_var["on_write"] = float(strategy.extended.read_var(keras.Variable(float(rank + 1))))

result = {
    "extended": type(strategy.extended).__name__,
    "read_var": read_var,
    "seed_state": seed_state,
    "weights": [w.tolist() for w in model.get_weights()],
    "loss": [float(v) for v in history.history["loss"]],
    "step_losses": step_losses,
    "replicas_in_sync": strategy.num_replicas_in_sync,
}
with open(os.path.join(out, f"instance-{popdist.getInstanceIndex()}.json"), "w") as f:
    json.dump(result, f)
