"""Run by tests/distributed/test_multiprocess.py in every instance of a job:
a Graphcore-style TensorFlow 2 custom training loop (a tf.function with
tf.GradientTape and optimizer.apply_gradients, run by strategy.run on a
dataset iterator; strategy.reduce on the host) of a tf.keras model
(KERAS_BACKEND=tensorflow) in a PopDistStrategy scope, on this instance's
share of one fixed data set (dealt as in data_parallel_fit.py). Each
instance writes its final weights and losses to OUT_DIR (argv[1]);
then the same training by tf.keras fit in the scope; instance 0 also
trains the same model from the same initial weights with plain
TensorFlow (no strategy, eager) on the global batches, as reference.

The imports are Graphcore's after the porting contract's edits.
"""

import json
import os
import sys

os.environ["KERAS_BACKEND"] = "tensorflow"

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from tensorflow import keras  # noqa: E402
from tensorflow.python import ipu  # noqa: E402  (keras_ipu, through the import hook)

import keras_ipu.popdist.tensorflow  # noqa: E402
from keras_ipu import popdist  # noqa: E402

BATCH = 4  # per replica
STEPS_PER_EXECUTION = 3
EXECUTIONS = 2

out = sys.argv[1]
config = ipu.config.IPUConfig()
keras_ipu.popdist.tensorflow.set_ipu_config(config)
config.configure_ipu_system()
strategy = ipu.distributed.popdist_strategy.PopDistStrategy()

steps = STEPS_PER_EXECUTION * EXECUTIONS
total, local = popdist.getNumTotalReplicas(), popdist.getNumLocalReplicas()
offset = popdist.getReplicaIndexOffset()
rng = np.random.default_rng(7)
x = rng.normal(size=(steps * total * BATCH, 5)).astype(np.float32)
y = (x @ rng.normal(size=(5, 1)) + 0.1).astype(np.float32)
# (steps, replicas, batch, ...) -> this instance's replicas, in infeed order
# (element i of the infeed goes to local replica i mod L).
mine = lambda a: a.reshape(steps, total, BATCH, -1)[:, offset:offset + local].reshape(-1, a.shape[-1])
dataset = tf.data.Dataset.from_tensor_slices((mine(x), mine(y))).batch(BATCH, drop_remainder=True)

keras.utils.set_random_seed(1 + popdist.getInstanceIndex())  # instance 0's weights are broadcast
with strategy.scope():
    model = keras.Sequential(
        [keras.Input((5,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(1)]
    )
    initial = model.get_weights()  # instance 0's are broadcast at the first run
    optimizer = keras.optimizers.SGD(0.05)

    @tf.function(jit_compile=True)
    def training_loop(iterator, count):
        mean_loss = 0.0
        for _ in tf.range(count):
            features, labels = next(iterator)
            with tf.GradientTape() as tape:
                predictions = model(features, training=True)
                per_example_loss = keras.losses.MSE(labels, predictions)
                # Divided by the global batch: the optimizer sums the
                # gradients over every replica of the job.
                loss = tf.nn.compute_average_loss(per_example_loss)
            gradients = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(gradients, model.trainable_variables))
            mean_loss += loss
        # The job's mean loss of the execution, the same on every replica.
        return tf.distribute.get_replica_context().all_reduce("SUM", mean_loss) / count

    iterator = iter(dataset)
    losses = []
    for _ in range(EXECUTIONS):
        loss = strategy.run(training_loop, args=[iterator, STEPS_PER_EXECUTION])
        losses.append(float(strategy.reduce(tf.distribute.ReduceOp.MEAN, loss, axis=None)))

# The same training by tf.keras fit (the front end's Keras trainer) from the
# same initial weights: its gradients are averaged over every replica of
# the job.
with strategy.scope():
    fitted = keras.Sequential(
        [keras.Input((5,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(1)]
    )
    fitted.set_weights(initial)
    fitted.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse",
                   steps_per_execution=STEPS_PER_EXECUTION)
    fitted.fit(mine(x), mine(y), batch_size=BATCH, epochs=1, shuffle=False, verbose=0)


def plain_tensorflow_reference():
    reference = keras.Sequential(
        [keras.Input((5,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(1)]
    )
    reference.set_weights(initial)
    sgd = keras.optimizers.SGD(0.05)
    for t in range(steps):
        features = x.reshape(steps, total * BATCH, -1)[t]
        labels = y.reshape(steps, total * BATCH, -1)[t]
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(keras.losses.MSE(labels, reference(features, training=True)))
        gradients = tape.gradient(loss, reference.trainable_variables)
        sgd.apply_gradients(zip(gradients, reference.trainable_variables))
    return [w.tolist() for w in reference.get_weights()]


result = {
    "fit_weights": [w.tolist() for w in fitted.get_weights()],
    "reference_weights": plain_tensorflow_reference() if popdist.getInstanceIndex() == 0 else None,
    "weights": [w.tolist() for w in model.get_weights()],
    "loss": losses,
    "replicas_in_sync": strategy.num_replicas_in_sync,
}
with open(os.path.join(out, f"instance-{popdist.getInstanceIndex()}.json"), "w") as f:
    json.dump(result, f)
