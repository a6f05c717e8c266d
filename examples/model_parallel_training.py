"""Keras' own distribution API on 4 IPUs: 2 replicas, each split over 2
IPUs by a ModelParallel LayoutMap (tensor parallelism, Megatron's MLP:
the first Dense column-parallel, the second row-parallel).

    KERAS_BACKEND=ipu python examples/model_parallel_training.py

The values are computed whole by the simulator (the same numbers as
without the split); what the split changes is what each IPU holds and does:
prints what is split, the collectives per run, each IPU's share of the
weights and the predicted cycles per step against the unsplit program.
Graphcore's TensorFlow SDK has no tensor parallelism: this is keras_ipu's
extension (README, "ModelParallel over a model axis").
"""

import os

os.environ.setdefault("KERAS_BACKEND", "ipu")

import keras  # noqa: E402

import keras_ipu as ipu  # noqa: E402
from synthetic_mnist import load  # noqa: E402


def make_model():
    keras.utils.set_random_seed(1)
    model = keras.Sequential([
        keras.Input((28, 28, 1)),
        keras.layers.Flatten(),
        keras.layers.Dense(256, activation="relu", name="dense_1"),
        keras.layers.Dense(10, name="dense_2"),
    ])
    model.compile(keras.optimizers.SGD(0.05, momentum=0.9),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"], steps_per_execution=8)
    return model


def fit_program(model):
    return model.train_function.execution.device_loop.executables()[-1]


def main():
    (x, y), (x_test, y_test) = load()
    config = ipu.config.IPUConfig()
    config.auto_select_ipus = 4
    config.configure_ipu_system()

    devices = keras.distribution.list_devices()
    print(f"devices: {devices}")
    mesh = keras.distribution.DeviceMesh((2, 2), ["batch", "model"], devices)
    layout_map = keras.distribution.LayoutMap(mesh)
    layout_map[".*dense_1/kernel"] = (None, "model")  # column-parallel
    layout_map[".*dense_1/bias"] = ("model",)
    layout_map[".*dense_2/kernel"] = ("model", None)  # row-parallel
    distribution = keras.distribution.ModelParallel(layout_map=layout_map)

    with distribution.scope():
        model = make_model()
        print(f"replicas: {model._get_replication_factor()} of 2 IPUs each")
        history = model.fit(x, y, batch_size=32, epochs=2, verbose=0)
        print(f"training loss: {history.history['loss'][0]:.3f} -> "
              f"{history.history['loss'][-1]:.3f}")
        _, accuracy = model.evaluate(x_test, y_test, batch_size=32, verbose=0)
        print(f"test accuracy: {accuracy:.3f}")
    split = fit_program(model)
    part = split.tensor_parallel.partitioned
    print(part.summary())
    for j, (whole, one) in sorted(part.sharded_input_bytes(split.graph).items()):
        print(f"  {dict(part.tp.names).get(j, f'input {j}')}: {whole:,} B, "
              f"{one:,} B on each IPU")

    # The same model on 2 IPUs without the split (DataParallel), for the
    # prediction side by side.
    config = ipu.config.IPUConfig()
    config.auto_select_ipus = 2
    config.configure_ipu_system()
    with keras.distribution.DataParallel().scope():
        whole = make_model()
        whole.fit(x, y, batch_size=32, epochs=1, verbose=0)
    unsplit = fit_program(whole)
    for name, exe in (("unsplit", unsplit), ("split over 2 IPUs", split)):
        memory = exe.memory_by_ipu[0]
        print(f"{name}: {exe.prediction.cycles_per_step:,.0f} cycles per step on each "
              f"IPU, inputs {memory.input_bytes:,} B on each IPU")


if __name__ == "__main__":
    main()
