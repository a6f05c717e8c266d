"""Keras fits under KERAS_BACKEND=ipu with TensorBoard profiling and the
graph on: the browser tests' data (argv[1]: log dir). A small CNN on one
IPU (run `cnn`), then a two-stage pipelined model on two IPUs (run
`pipelined`), so the pages show a program placed on several IPUs too."""

import os
import sys

import keras
import numpy as np

import keras_ipu as ipu

logdir = sys.argv[1]
keras.utils.set_random_seed(0)
model = keras.Sequential([
    keras.Input((16, 16, 1)),
    keras.layers.Conv2D(8, 3, activation="relu"),
    keras.layers.BatchNormalization(),
    keras.layers.MaxPooling2D(2),
    keras.layers.Flatten(),
    keras.layers.Dense(16, activation="relu"),
    keras.layers.Dense(2, activation="softmax"),
], name="cnn")
model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9),
              loss="sparse_categorical_crossentropy", metrics=["accuracy"],
              steps_per_execution=2)
rng = np.random.default_rng(0)
x = rng.random((256, 16, 16, 1), np.float32)
y = rng.integers(0, 2, 256).astype("int32")
model.fit(x, y, batch_size=32, epochs=2, verbose=0, validation_split=0.25,
          callbacks=[keras.callbacks.TensorBoard(os.path.join(logdir, "cnn"),
                                                 profile_batch=(2, 4), write_graph=True)])

config = ipu.config.IPUConfig()
config.auto_select_ipus = 2
config.configure_ipu_system()
with ipu.ipu_strategy.IPUStrategy().scope():
    inputs = keras.Input((64,))
    with ipu.keras.PipelineStage(0):
        h = keras.layers.Dense(256, activation="relu", name="stage0_dense")(inputs)
    with ipu.keras.PipelineStage(1):
        outputs = keras.layers.Dense(10, name="stage1_dense")(h)
    pipelined = keras.Model(inputs, outputs, name="pipelined")
    pipelined.compile(optimizer=keras.optimizers.SGD(0.1),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      steps_per_execution=8)
    pipelined.set_pipelining_options(gradient_accumulation_steps_per_replica=4)
x = rng.random((128, 64), np.float32)
y = rng.integers(0, 10, 128).astype("int32")
pipelined.fit(x, y, batch_size=8, epochs=1, verbose=0,
              callbacks=[keras.callbacks.TensorBoard(os.path.join(logdir, "pipelined"),
                                                     profile_batch=(2, 3))])
