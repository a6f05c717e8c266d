"""Train a small Keras CNN on the simulated IPU.

    KERAS_BACKEND=ipu python examples/train_on_ipu.py

The data are the synthetic stripe images of predict_on_ipu.py (horizontal
or vertical stripes with random period, phase and noise). fit() runs
`steps_per_execution` training steps as one compiled executable on the ipu
backend: the step (forward, gradients, SGD update) is traced into the IR,
differentiated, compiled and run with the weights as explicit inputs and
outputs. Run the same file with KERAS_BACKEND=tensorflow to compare.

On the ipu backend every compiled program also gets the simulator's
prediction for a real IPU (memory per IPU and tile, cycles per step): the
example asks Poplar's way for a report of each program
(POPLAR_ENGINE_OPTIONS autoReport, unless you set your own) and prints the
summary `python -m keras_ipu.report DIR` gives, with its pictures.
"""

import json
import os
import tempfile

os.environ.setdefault("KERAS_BACKEND", "ipu")
REPORT_DIR = None
if os.environ["KERAS_BACKEND"] == "ipu" and "POPLAR_ENGINE_OPTIONS" not in os.environ:
    REPORT_DIR = tempfile.mkdtemp(prefix="ipu_reports_")
    os.environ["POPLAR_ENGINE_OPTIONS"] = json.dumps(
        {"autoReport.all": "true", "autoReport.directory": REPORT_DIR}
    )

import keras  # noqa: E402

from predict_on_ipu import SIZE  # noqa: E402
from predict_on_ipu import make_stripes  # noqa: E402


def build_cnn():
    return keras.Sequential(
        [
            keras.Input((SIZE, SIZE, 1)),
            keras.layers.Conv2D(8, 3, activation="relu"),
            keras.layers.BatchNormalization(),
            keras.layers.MaxPooling2D(2),
            keras.layers.Conv2D(8, 3, activation="relu"),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dropout(0.1),
            keras.layers.Dense(2, activation="softmax"),
        ]
    )


def main():
    print(f"backend: {keras.backend.backend()}")
    keras.utils.set_random_seed(0)
    x_train, y_train = make_stripes(2048, seed=1)
    x_test, y_test = make_stripes(512, seed=2)
    model = build_cnn()
    model.compile(
        optimizer=keras.optimizers.SGD(0.05, momentum=0.9),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
        steps_per_execution=8,
    )
    history = model.fit(
        x_train, y_train, batch_size=64, epochs=3, validation_split=0.125
    )
    loss, accuracy = model.evaluate(x_test, y_test, batch_size=128, verbose=0)
    first, last = history.history["loss"][0], history.history["loss"][-1]
    print(f"training loss: {first:.4f} -> {last:.4f}")
    print(f"test: loss={loss:.4f} accuracy={accuracy:.3f}")
    if REPORT_DIR:
        from keras_ipu.report.__main__ import main as report

        print(f"\nPredicted for a real IPU (python -m keras_ipu.report {REPORT_DIR}):")
        try:
            import matplotlib  # noqa: F401  (the [profile] extra draws pictures)
        except ImportError:
            report([REPORT_DIR, "--top", "3", "--no-pictures"])
            print("\n(The report's pictures need matplotlib: pip install -e '.[profile]')")
        else:
            report([REPORT_DIR, "--top", "3"])


if __name__ == "__main__":
    main()
