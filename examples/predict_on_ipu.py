"""Inference with a small Keras CNN on the ipu backend.

    KERAS_BACKEND=ipu python examples/predict_on_ipu.py

The data are synthetic 16x16 images of horizontal or vertical stripes. The
CNN's weights are set by hand (an edge filter per orientation), so it
classifies the stripes without any fit() (train_on_ipu.py trains one).
predict() and evaluate() run as compiled executables on the ipu backend.
Run the same file with KERAS_BACKEND=tensorflow to compare.
"""

import os

os.environ.setdefault("KERAS_BACKEND", "ipu")

import numpy as np  # noqa: E402

import keras  # noqa: E402

SIZE = 16
CLASSES = ["horizontal stripes", "vertical stripes"]


def make_stripes(count, seed=0):
    """Images (count, 16, 16, 1) of stripes with random period, phase and
    noise; label 0 for horizontal stripes, 1 for vertical ones."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 2, size=count)
    period = rng.integers(3, 7, size=(count, 1, 1))
    phase = rng.uniform(0, 2 * np.pi, size=(count, 1, 1))
    rows, cols = np.meshgrid(np.arange(SIZE), np.arange(SIZE), indexing="ij")
    along = np.where(labels[:, None, None] == 0, rows, cols)
    images = np.sin(2 * np.pi * along / period + phase)
    images += rng.normal(0, 0.2, size=images.shape)
    return images[..., None].astype("float32"), labels.astype("int32")


def build_cnn():
    model = keras.Sequential(
        [
            keras.Input((SIZE, SIZE, 1)),
            keras.layers.Conv2D(2, 3, use_bias=False, name="edges"),
            keras.layers.Activation("relu"),
            keras.layers.MaxPooling2D(2),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(2, activation="softmax", name="classify"),
        ]
    )
    # Filter 0 responds to change down the rows (horizontal stripes),
    # filter 1 to change along the columns (vertical stripes).
    sobel = np.array([[-1, -2, -1], [0, 0, 0], [1, 2, 1]], "float32")
    kernel = np.stack([sobel, sobel.T], axis=-1)[:, :, None, :]
    model.get_layer("edges").set_weights([kernel])
    model.get_layer("classify").set_weights(
        [np.array([[0.3, -0.3], [-0.3, 0.3]], "float32"), np.zeros(2, "float32")]
    )
    return model


def main():
    print(f"Keras {keras.__version__}, backend: {keras.backend.backend()}")
    images, labels = make_stripes(64)
    model = build_cnn()
    model.summary()

    model.compile(
        loss="sparse_categorical_crossentropy",
        metrics=["sparse_categorical_accuracy"],
        steps_per_execution=2,
    )
    probabilities = model.predict(images, batch_size=16, verbose=0)
    for p, label in zip(probabilities[:6], labels[:6]):
        guess = int(np.argmax(p))
        print(
            f"  p={np.round(p, 3)} -> {CLASSES[guess]:<18} "
            f"(true: {CLASSES[label]})"
        )

    results = model.evaluate(
        images, labels, batch_size=16, verbose=0, return_dict=True
    )
    accuracy = float(np.mean(np.argmax(probabilities, axis=1) == labels))
    print(f"predict accuracy: {accuracy:.3f}")
    print(
        f"evaluate: loss={results['loss']:.4f} "
        f"accuracy={results['sparse_categorical_accuracy']:.3f}"
    )


if __name__ == "__main__":
    main()
