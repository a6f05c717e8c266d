"""PipelineSequential, the SDK 2.1 way: a list of stages, each a list of
layers, with the gradient accumulation count and the pipeline's options as
constructor arguments; fit counts steps of gradient_accumulation_count
mini-batches and runs `steps_per_run` of them per execution on the device.

    KERAS_BACKEND=ipu python examples/pipeline_sequential.py

Prints the training and what the simulator predicts for the pipeline.
"""

import os

os.environ.setdefault("KERAS_BACKEND", "ipu")

import keras  # noqa: E402

import keras_ipu as ipu  # noqa: E402
from keras_ipu.ops.pipelining_ops import PipelineSchedule  # noqa: E402
from synthetic_mnist import load  # noqa: E402


def main():
    (x, y), (x_test, y_test) = load()
    config = ipu.config.IPUConfig()
    config.auto_select_ipus = 2
    config.configure_ipu_system()

    strategy = ipu.ipu_strategy.IPUStrategy()
    with strategy.scope():
        model = ipu.keras.PipelineSequential(
            [
                [keras.layers.Flatten(), keras.layers.Dense(128, activation="relu")],
                [keras.layers.Dense(64, activation="relu"), keras.layers.Dense(10)],
            ],
            gradient_accumulation_count=8,
            pipeline_schedule=PipelineSchedule.Interleaved,
        )
        model.compile(keras.optimizers.SGD(0.005),
                      keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"])
        history = model.fit(x, y, batch_size=16, epochs=2, steps_per_run=4, verbose=0)
        print(f"training loss: {history.history['loss'][0]:.3f} -> {history.history['loss'][-1]:.3f}")
        _, accuracy = model.evaluate(x_test, y_test, batch_size=16, verbose=0)
        print(f"test accuracy: {accuracy:.3f}")
        print(ipu.models.predict_training(model, 16))


if __name__ == "__main__":
    main()
