"""Small real models, built the same way under any Keras backend.

Used twice: the tests build each model under KERAS_BACKEND=ipu, give it
random weights and save them; then this file runs as a script under
KERAS_BACKEND=tensorflow, builds the same architectures, loads those weights
and writes TensorFlow's predictions and evaluate() results:

    KERAS_BACKEND=tensorflow python tests/models/model_zoo.py WORKDIR

WORKDIR/<model name>/ holds model.weights.h5 and data.npz (inputs and
targets) and receives reference.npz.
"""

import dataclasses
import os
import sys
from pathlib import Path

import numpy as np


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    name: str
    build: object  # keras -> keras.Model
    data: object  # np.random.Generator -> (x, y)
    loss: object  # keras -> loss argument of compile()
    metrics: object  # keras -> metrics argument of compile()
    batch_size: int = 4


# --------------------------------------------------------------------------
# Architectures


def mlp_sequential(keras):
    return keras.Sequential(
        [
            keras.Input((12,)),
            keras.layers.Dense(16, activation="relu"),
            keras.layers.Dropout(0.5),
            keras.layers.Dense(8, activation="tanh"),
            keras.layers.Dense(3, activation="softmax"),
        ]
    )


def cnn2d_sequential(keras):
    return keras.Sequential(
        [
            keras.Input((16, 16, 3)),
            keras.layers.Conv2D(4, 3, padding="same", activation="relu"),
            keras.layers.MaxPooling2D(2),
            keras.layers.Conv2D(6, 3, strides=2, padding="valid"),
            keras.layers.BatchNormalization(),
            keras.layers.AveragePooling2D(2, padding="same"),
            keras.layers.Flatten(),
            keras.layers.Dropout(0.2),
            keras.layers.Dense(5),
        ]
    )


def conv1d_functional(keras):
    x = inputs = keras.Input((20, 6))
    x = keras.layers.Conv1D(8, 5, padding="causal", dilation_rate=2)(x)
    x = keras.layers.MaxPooling1D(2)(x)
    x = keras.layers.Conv1D(4, 3, activation="sigmoid")(x)
    x = keras.layers.AveragePooling1D(2)(x)
    a = keras.layers.GlobalMaxPooling1D()(x)
    b = keras.layers.GlobalAveragePooling1D()(x)
    x = keras.layers.Concatenate()([a, b])
    outputs = keras.layers.Dense(2)(x)
    return keras.Model(inputs, outputs)


def conv3d_functional(keras):
    x = inputs = keras.Input((8, 8, 8, 2))
    x = keras.layers.Conv3D(3, 3, padding="same", activation="relu")(x)
    x = keras.layers.MaxPooling3D(2)(x)
    x = keras.layers.BatchNormalization()(x)
    x = keras.layers.Conv3D(4, 2, strides=2)(x)
    x = keras.layers.AveragePooling3D(2)(x)
    x = keras.layers.GlobalAveragePooling3D()(x)
    outputs = keras.layers.Dense(2)(x)
    return keras.Model(inputs, outputs)


def recurrent_functional(keras):
    tokens = keras.Input((10,), dtype="int32")
    x = keras.layers.Embedding(50, 8)(tokens)
    x = keras.layers.LSTM(6, return_sequences=True)(x)
    x = keras.layers.GRU(5)(x)
    outputs = keras.layers.Dense(3, activation="softmax")(x)
    return keras.Model(tokens, outputs)


def attention_functional(keras):
    inputs = keras.Input((7, 16))
    attended = keras.layers.MultiHeadAttention(num_heads=2, key_dim=4)(
        inputs, inputs
    )
    x = keras.layers.Add()([inputs, attended])
    x = keras.layers.LayerNormalization()(x)
    x = keras.layers.Dense(16, activation="gelu")(x)
    x = keras.layers.Dropout(0.1)(x)
    x = keras.layers.GlobalAveragePooling1D()(x)
    outputs = keras.layers.Dense(4)(x)
    return keras.Model(inputs, outputs)


def two_inputs_two_outputs(keras):
    a = keras.Input((6,), name="a")
    b = keras.Input((4,), name="b")
    h = keras.layers.Concatenate()(
        [keras.layers.Dense(5, activation="relu")(a), keras.layers.Dense(3)(b)]
    )
    h = keras.layers.LayerNormalization()(h)
    label = keras.layers.Dense(3, activation="softmax", name="label")(h)
    value = keras.layers.Dense(1, name="value")(h)
    return keras.Model({"a": a, "b": b}, {"label": label, "value": value})


# --------------------------------------------------------------------------
# Data


def _regression(shape, out):
    def data(rng):
        x = rng.normal(size=(10,) + shape).astype("float32")
        y = rng.normal(size=(10, out)).astype("float32")
        return x, y

    return data


def _classes(shape, classes):
    def data(rng):
        x = rng.normal(size=(10,) + shape).astype("float32")
        y = rng.integers(0, classes, size=(10,)).astype("int32")
        return x, y

    return data


def _tokens(rng):
    x = rng.integers(0, 50, size=(10, 10)).astype("int32")
    y = rng.integers(0, 3, size=(10,)).astype("int32")
    return x, y


def _two_inputs(rng):
    x = {
        "a": rng.normal(size=(10, 6)).astype("float32"),
        "b": rng.normal(size=(10, 4)).astype("float32"),
    }
    y = {
        "label": rng.integers(0, 3, size=(10,)).astype("int32"),
        "value": rng.normal(size=(10, 1)).astype("float32"),
    }
    return x, y


def _sparse_ce(keras):
    return "sparse_categorical_crossentropy"


def _mse(keras):
    return "mse"


SPECS = [
    ModelSpec(
        "mlp_sequential",
        mlp_sequential,
        _classes((12,), 3),
        _sparse_ce,
        lambda keras: ["sparse_categorical_accuracy"],
    ),
    ModelSpec(
        "cnn2d_sequential",
        cnn2d_sequential,
        _regression((16, 16, 3), 5),
        _mse,
        lambda keras: ["mae"],
    ),
    ModelSpec(
        "conv1d_functional",
        conv1d_functional,
        _regression((20, 6), 2),
        _mse,
        lambda keras: ["mae", "mse"],
    ),
    ModelSpec(
        "conv3d_functional",
        conv3d_functional,
        _regression((8, 8, 8, 2), 2),
        _mse,
        lambda keras: ["mae"],
        batch_size=3,
    ),
    ModelSpec(
        "recurrent_functional",
        recurrent_functional,
        _tokens,
        _sparse_ce,
        lambda keras: ["sparse_categorical_accuracy"],
    ),
    ModelSpec(
        "attention_functional",
        attention_functional,
        _regression((7, 16), 4),
        _mse,
        lambda keras: ["mae"],
    ),
    ModelSpec(
        "two_inputs_two_outputs",
        two_inputs_two_outputs,
        _two_inputs,
        lambda keras: {"label": "sparse_categorical_crossentropy", "value": "mse"},
        lambda keras: {"label": ["sparse_categorical_accuracy"], "value": ["mae"]},
        # Batches of equal size: with a short last batch, Keras on TensorFlow
        # averages the per-output losses (label_loss, value_loss) per batch
        # rather than per sample (its total loss is right; ours are per
        # sample, equal to a single full batch).
        batch_size=5,
    ),
]
SPECS_BY_NAME = {spec.name: spec for spec in SPECS}


def compile_for_evaluate(model, spec, keras):
    model.compile(loss=spec.loss(keras), metrics=spec.metrics(keras))


def randomize_weights(model, rng):
    """Non-trivial weights (fresh BatchNormalization statistics are 0 and 1,
    biases 0), small enough that no activation saturates."""
    for variable in model.weights:
        if "variance" in variable.path:
            value = rng.uniform(0.5, 1.5, size=variable.shape)
        else:
            value = rng.normal(0.0, 0.4, size=variable.shape)
        variable.assign(value.astype(variable.dtype))


# --------------------------------------------------------------------------
# Saved inputs: flat arrays in an .npz, structure from the spec's data()


def save_data(path, x, y):
    from keras import tree

    arrays = {}
    for prefix, struct in (("x", x), ("y", y)):
        for i, leaf in enumerate(tree.flatten(struct)):
            arrays[f"{prefix}{i}"] = leaf
    np.savez(path, **arrays)


def load_data(path, spec):
    from keras import tree

    template_x, template_y = spec.data(np.random.default_rng(0))
    with np.load(path) as f:
        flat_x = [f[f"x{i}"] for i in range(len(tree.flatten(template_x)))]
        flat_y = [f[f"y{i}"] for i in range(len(tree.flatten(template_y)))]
    return (
        tree.pack_sequence_as(template_x, flat_x),
        tree.pack_sequence_as(template_y, flat_y),
    )


def flat_outputs(outputs):
    from keras import tree

    return [np.asarray(o) for o in tree.flatten(outputs)]


# --------------------------------------------------------------------------
# Reference run (this file as a script)


def write_reference(workdir):
    import keras

    assert keras.backend.backend() != "ipu", "the reference runs on another backend"
    for model_dir in sorted(Path(workdir).iterdir()):
        spec = SPECS_BY_NAME[model_dir.name]
        if not (model_dir / "model.weights.h5").exists():
            continue  # the ipu side could not build it
        model = spec.build(keras)
        model.load_weights(model_dir / "model.weights.h5")
        x, y = load_data(model_dir / "data.npz", spec)
        predictions = model.predict(x, batch_size=spec.batch_size, verbose=0)
        compile_for_evaluate(model, spec, keras)
        results = model.evaluate(
            x, y, batch_size=spec.batch_size, verbose=0, return_dict=True
        )
        arrays = {
            f"predict{i}": o for i, o in enumerate(flat_outputs(predictions))
        }
        for key, value in results.items():
            arrays[f"evaluate/{key}"] = np.asarray(value)
        np.savez(model_dir / "reference.npz", **arrays)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(f"usage: KERAS_BACKEND=tensorflow {sys.argv[0]} WORKDIR")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    write_reference(sys.argv[1])
