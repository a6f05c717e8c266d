"""Run by tests/distributed/test_multiprocess.py: fit under PopDistStrategy
(2 instances) with BackupAndRestore and ModelCheckpoint into OUT_DIR
(argv[1]). argv[2]:

- crash: instance 1 kills itself (SIGKILL) while instance 0 is writing the
  backup of epoch 1 (instance 0's HDF5 writer stalls there for an hour, so
  the kill lands mid-write and only the launcher can end instance 0);
  instance 1 writes the time of its death to OUT_DIR/instance-1-killed-at;
- resume / reference: train to the end; each instance writes its final
  weights and the epochs it ran to OUT_DIR/result-<i>.json.
"""

import json
import os
import signal
import sys
import time

import numpy as np

os.environ.setdefault("KERAS_BACKEND", "ipu")

import h5py  # noqa: E402
import keras  # noqa: E402

import keras_ipu.popdist.tensorflow  # noqa: E402
from keras_ipu import popdist  # noqa: E402
from keras_ipu.config import IPUConfig  # noqa: E402
from keras_ipu.distributed.popdist_strategy import PopDistStrategy  # noqa: E402

out, mode = sys.argv[1], sys.argv[2]
marker = os.path.join(out, "instance-0-is-writing")
config = keras_ipu.popdist.tensorflow.set_ipu_config(IPUConfig())
config.configure_ipu_system()
strategy = PopDistStrategy()
index = popdist.getInstanceIndex()


class Crash(keras.callbacks.Callback):
    """Instance 0: its next HDF5 dataset write after epoch 1 stalls (and
    says so); instance 1: waits for that, then dies."""

    def on_epoch_end(self, epoch, logs=None):
        if mode != "crash" or epoch != 1:
            return
        if index == 0:
            create = h5py.Group.create_dataset

            def stalled(group, *args, **kwargs):
                dataset = create(group, *args, **kwargs)
                open(marker, "w").close()
                time.sleep(3600)  # the job is killed meanwhile
                return dataset

            h5py.Group.create_dataset = stalled
        else:
            # Instance 0 reaches its write at once (both left the epoch's
            # last all-reduce together); the test's hang limit ends a job
            # where it does not.
            while not os.path.exists(marker):
                time.sleep(0.05)
            with open(os.path.join(out, "instance-1-killed-at"), "w") as f:
                f.write(repr(time.time()))
            os.kill(os.getpid(), signal.SIGKILL)


rng = np.random.default_rng(3)
x = rng.normal(size=(64, 4)).astype(np.float32)
y = (x @ rng.normal(size=(4, 1))).astype(np.float32)
keras.utils.set_random_seed(5)
with strategy.scope():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="tanh"),
                              keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9), loss="mse",
                  steps_per_execution=4)
    history = model.fit(
        x[index::2], y[index::2], batch_size=8, epochs=4, shuffle=False, verbose=0,
        callbacks=[
            Crash(),
            keras.callbacks.BackupAndRestore(os.path.join(out, "backup")),
            keras.callbacks.ModelCheckpoint(os.path.join(out, "ckpt.weights.h5"),
                                            save_weights_only=True),
        ],
    )
with open(os.path.join(out, f"result-{index}.json"), "w") as f:
    json.dump({"weights": [w.tolist() for w in model.get_weights()], "epochs": history.epoch}, f)
