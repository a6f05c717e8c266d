"""Run by tests/distributed/test_keras_distribution_processes.py in every
instance of a poprun job: Megatron's MLP trained with fit under a
keras.distribution ModelParallel whose mesh is this instance's IPUs (its
replicas x 2 IPUs of the model axis), on this instance's share of one
global data set; writes its weights and losses to OUT_DIR (argv[1]).

Each instance starts from other random weights (seed 1 + its index):
fit must start every instance from instance 0's.
"""

import json
import os
import sys

import numpy as np

os.environ.setdefault("KERAS_BACKEND", "ipu")

import keras  # noqa: E402
from keras.distribution import DeviceMesh  # noqa: E402
from keras.distribution import LayoutMap  # noqa: E402
from keras.distribution import ModelParallel  # noqa: E402

import keras_ipu.popdist.tensorflow  # noqa: E402
from keras_ipu import popdist  # noqa: E402
from keras_ipu.config import IPUConfig  # noqa: E402

GLOBAL_BATCH, STEPS = 16, 2


def model(seed):
    keras.utils.set_random_seed(seed)
    m = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, name="d1"),
                          keras.layers.Dense(1, name="d2")])
    m.compile(keras.optimizers.SGD(0.1), "mse")
    return m


def data():
    rng = np.random.default_rng(0)
    return (rng.normal(size=(STEPS * GLOBAL_BATCH, 4)).astype("float32"),
            rng.normal(size=(STEPS * GLOBAL_BATCH, 1)).astype("float32"))


def layout_map(mesh):
    layouts = LayoutMap(mesh)
    layouts[".*d1/kernel"] = (None, "model")
    layouts[".*d2/kernel"] = ("model", None)
    return layouts


if __name__ == "__main__":
    out = sys.argv[1]
    config = keras_ipu.popdist.tensorflow.set_ipu_config(IPUConfig())
    config.configure_ipu_system()
    devices = keras.distribution.list_devices()
    rank, instances = popdist.getInstanceIndex(), popdist.getNumInstances()
    mesh = DeviceMesh((len(devices) // 2, 2), ["batch", "model"], devices)
    distribution = ModelParallel(layout_map=layout_map(mesh))
    distribution.auto_shard_dataset = False  # each instance passes its own share
    x, y = data()
    # Of every global batch, this instance's consecutive 1/instances.
    share = lambda a: a.reshape(STEPS, instances, -1, a.shape[-1])[:, rank].reshape(-1, a.shape[-1])
    with distribution.scope():
        m = model(1 + rank)
        history = m.fit(share(x), share(y), batch_size=GLOBAL_BATCH // instances, epochs=1,
                        shuffle=False, verbose=0)
    [exe] = m.train_function.execution.device_loop.executables()
    result = {
        "devices": devices,
        "weights": [w.tolist() for w in m.get_weights()],
        "loss": history.history["loss"],
        "split": exe.tensor_parallel.partitioned.input_shardings[:4],
    }
    with open(os.path.join(out, f"instance-{rank}.json"), "w") as f:
        json.dump(result, f)
