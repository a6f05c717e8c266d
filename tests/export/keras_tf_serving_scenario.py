"""Run by path under KERAS_BACKEND=tensorflow (test_keras_serving.py): a
tf.keras model made in an IPUStrategy scope exported with
export_for_ipu_serving; prints JSON with Keras' own outputs, the
reloaded SavedModel's, and the programs the TensorFlow front end compiled."""

import json
import sys

import numpy as np
import tensorflow as tf

import keras
import keras_ipu as ipu
from keras_ipu.frontends.tensorflow import function as bridge_function

path = sys.argv[1]
strategy = ipu.ipu_strategy.IPUStrategy()
with strategy.scope():
    model = keras.Sequential([keras.Input((6,), batch_size=4), keras.layers.Dense(5, "tanh"),
                              keras.layers.Dense(2)])
x = np.random.default_rng(0).random((4, 6)).astype("float32")
compiled = []
original = bridge_function.BridgedFunction._import


def counting(self, *args, **kwargs):
    compiled.append(self.__name__)
    return original(self, *args, **kwargs)


bridge_function.BridgedFunction._import = counting
model.export_for_ipu_serving(path)
served = tf.saved_model.load(path).signatures["serving_default"](tf.constant(x))["output_0"]
print(json.dumps({"keras": model(x).numpy().tolist(), "served": served.numpy().tolist(),
                  "programs": len(compiled)}))
