"""Keras' TensorBoard(profile_batch=...) on a tf.keras model trained in an
IPUStrategy scope, run as a script under KERAS_BACKEND=tensorflow:

    KERAS_BACKEND=tensorflow python tensorboard_tf_scenario.py LOGDIR

Prints one JSON object on its last line: what the profile directory holds.
Used by test_tensorflow_profile.py.
"""

import glob
import json
import os
import sys

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def main(logdir):
    import keras
    from tensorflow.python.ipu import ipu_strategy

    from keras_ipu.report import xspace

    rng = np.random.default_rng(0)
    x = rng.normal(size=(48, 6)).astype(np.float32)
    y = rng.integers(0, 3, size=(48,)).astype(np.int32)
    strategy = ipu_strategy.IPUStrategy()
    with strategy.scope():
        model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="relu"),
                                  keras.layers.Dense(3)])
        model.compile(optimizer="sgd",
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[
            keras.callbacks.TensorBoard(logdir, profile_batch=(2, 3), write_graph=False)])
    (path,) = glob.glob(os.path.join(logdir, "**", "plugins", "profile", "*", "*.xplane.pb"),
                        recursive=True)
    space = xspace.read_xspace(path)
    out = {"on_ipu": getattr(model, "_ipu_tf_strategy", None) is strategy,
           "planes": [p.name for p in space.planes], "steps": [], "runs": 0,
           "trace_json": bool(glob.glob(os.path.join(os.path.dirname(path), "*.trace.json.gz")))}
    for plane in space.planes:
        names = {k: m.name for k, m in plane.event_metadata.items()}
        for line in plane.lines:
            if plane.name.startswith("/device:CUSTOM:IPU") and line.name == "Program steps":
                out["steps"] = [names[e.metadata_id] for e in line.events]
            if line.name.startswith("keras_ipu program runs"):
                out["runs"] = len(line.events)
    return out


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])))
