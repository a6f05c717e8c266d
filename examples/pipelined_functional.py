"""A Functional model pipelined over two IPUs with PipelineStage (Graphcore's
SDK 2.2+ API): each layer is built in the stage it runs in;
set_pipelining_options sets the micro-batches of each weight update and the
schedule.

    KERAS_BACKEND=ipu python examples/pipelined_functional.py

A pipeline computes what gradient accumulation over its micro-batches
computes; what changes is when each stage runs on which IPU, which the
simulator predicts: memory per IPU (weights, optimizer state, activations
stashed for the schedule), copies between the IPUs and the pipeline's
bubbles. Printed for each schedule.
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
        inputs = keras.Input((28, 28, 1))
        with ipu.keras.PipelineStage(0):
            h = keras.layers.Conv2D(16, 3, activation="relu")(inputs)
            h = keras.layers.MaxPooling2D(2)(h)
        with ipu.keras.PipelineStage(1):
            h = keras.layers.Flatten()(h)
            h = keras.layers.Dense(64, activation="relu")(h)
            outputs = keras.layers.Dense(10)(h)
        model = keras.Model(inputs, outputs)
        # MEAN: the mean of the 8 micro-batches' gradients (Graphcore's
        # default, SUM, would take 8 times the step with this learning rate).
        model.set_pipelining_options(gradient_accumulation_steps_per_replica=8,
                                     gradient_accumulation_reduction_method="mean",
                                     pipeline_schedule=PipelineSchedule.Grouped)
        model.compile(keras.optimizers.SGD(0.05),
                      keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"], steps_per_execution=16)
        model.print_pipeline_stage_assignment_summary()
        history = model.fit(x, y, batch_size=16, epochs=2, verbose=0)
        print(f"training loss: {history.history['loss'][0]:.3f} -> {history.history['loss'][-1]:.3f}")
        _, accuracy = model.evaluate(x_test, y_test, batch_size=16, verbose=0)
        print(f"test accuracy: {accuracy:.3f}")
        for schedule in PipelineSchedule:
            print(ipu.models.predict_training(model, 16, schedule=schedule))


if __name__ == "__main__":
    main()
