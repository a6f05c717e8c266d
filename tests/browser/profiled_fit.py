"""A small Keras CNN trained under KERAS_BACKEND=ipu with TensorBoard
profiling and the graph on: the browser tests' data (argv[1]: log dir)."""

import sys

import keras
import numpy as np

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
          callbacks=[keras.callbacks.TensorBoard(logdir, profile_batch=(2, 4),
                                                 write_graph=True)])
