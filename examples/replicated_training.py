"""Data-parallel training on 4 replicas: the IPUStrategy's device has 4
IPUs, the model one stage, so fit runs 4 replicas, each on its own batches,
all-reducing the gradients every step.

    KERAS_BACKEND=ipu python examples/replicated_training.py

`steps_per_execution` counts one replica's steps; each replica keeps its own
BatchNormalization statistics and metrics (set_replication_options says how
the metrics of the replicas are combined). Prints the simulator's
prediction: one replica's memory per IPU, the all-reduce's cost, samples/s
of the four.
"""

import os

os.environ.setdefault("KERAS_BACKEND", "ipu")

import keras  # noqa: E402

import keras_ipu as ipu  # noqa: E402
from synthetic_mnist import load  # noqa: E402


def main():
    (x, y), (x_test, y_test) = load()
    config = ipu.config.IPUConfig()
    config.auto_select_ipus = 4
    config.configure_ipu_system()

    strategy = ipu.ipu_strategy.IPUStrategy()
    with strategy.scope():
        model = keras.Sequential([
            keras.Input((28, 28, 1)),
            keras.layers.Conv2D(8, 3),
            keras.layers.BatchNormalization(),
            keras.layers.ReLU(),
            keras.layers.MaxPooling2D(2),
            keras.layers.Flatten(),
            keras.layers.Dense(10),
        ])
        model.compile(keras.optimizers.SGD(0.05),
                      keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"], steps_per_execution=8)
        model.set_replication_options("MEAN")
        print(f"replication factor: {model._get_replication_factor()}")
        history = model.fit(x, y, batch_size=16, epochs=2, verbose=0)
        print(f"training loss: {history.history['loss'][0]:.3f} -> "
              f"{history.history['loss'][-1]:.3f} (mean of the replicas)")
        _, accuracy = model.evaluate(x_test, y_test, batch_size=16, verbose=0)
        print(f"test accuracy (mean of the replicas): {accuracy:.3f}")
        print(ipu.models.predict_training(model, 16))


if __name__ == "__main__":
    main()
