"""model.export / keras.export.ExportArchive on the ipu backend (issue 12,
item 5): the SavedModel TensorFlow loads gives the numbers keras_ipu gives,
in this process and in a fresh TensorFlow process that never imports
keras_ipu's backend."""

import numpy as np
import pytest

import keras

tf = pytest.importorskip("tensorflow")


def _conv_model():
    return keras.Sequential([
        keras.Input((8, 8, 3)),
        keras.layers.Conv2D(4, 3, padding="same", activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.BatchNormalization(),
        keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dropout(0.5),
        keras.layers.Dense(3, activation="softmax"),
    ])


def _dict_model():
    inputs = keras.Input((6,))
    h = keras.layers.LayerNormalization()(inputs)
    return keras.Model(inputs, {
        "logits": keras.layers.Dense(2)(h),
        "folded": keras.layers.Reshape((3, 2))(h),
    })


def test_model_export_runs_in_tensorflow_with_an_open_batch(tmp_path):
    model = _conv_model()
    x = np.random.default_rng(0).random((5, 8, 8, 3)).astype("float32")
    expected = model.predict(x, verbose=0)
    model.export(str(tmp_path / "conv"), verbose=False)

    loaded = tf.saved_model.load(str(tmp_path / "conv"))
    np.testing.assert_allclose(loaded.serve(x).numpy(), expected, atol=1e-5)
    # The batch size was left open in the signature: another one runs too.
    assert loaded.serve(x[:2]).numpy().shape == (2, 3)
    signature = loaded.signatures["serving_default"]
    assert signature.structured_input_signature[1][
        next(iter(signature.structured_input_signature[1]))].shape.as_list() == [None, 8, 8, 3]
    # The weights are variables of the SavedModel, not constants.
    assert len(loaded.variables) == len(model.variables)


def test_nested_outputs_keep_their_structure(tmp_path):
    model = _dict_model()
    x = np.random.default_rng(1).random((4, 6)).astype("float32")
    expected = model.predict(x, verbose=0)
    model.export(str(tmp_path / "dict"), verbose=False)
    loaded = tf.saved_model.load(str(tmp_path / "dict"))
    out = loaded.serve(x)
    assert set(out) == {"logits", "folded"}
    for key in expected:
        np.testing.assert_allclose(out[key].numpy(), expected[key], atol=1e-5)


def test_an_endpoint_that_assigns_a_variable_updates_it(tmp_path):
    class Counting(keras.layers.Layer):
        def build(self, shape):
            self.calls = self.add_weight(shape=(), initializer="zeros", trainable=False)
            self.scale = self.add_weight(shape=(shape[-1],), initializer="ones")

        def call(self, x):
            self.calls.assign(self.calls + 1.0)
            return x * self.scale + self.calls

    layer = Counting()
    layer.build((None, 3))
    archive = keras.export.ExportArchive()
    archive.track(layer)
    archive.add_endpoint("count", layer.call,
                         input_signature=[keras.InputSpec(shape=(None, 3), dtype="float32")])
    archive.write_out(str(tmp_path / "counting"), verbose=False)
    # Exporting does not run the endpoint on the Keras side.
    assert float(layer.calls.numpy()) == 0.0

    loaded = tf.saved_model.load(str(tmp_path / "counting"))
    x = np.ones((2, 3), "float32")
    np.testing.assert_allclose(loaded.count(x).numpy(), np.full((2, 3), 2.0))
    np.testing.assert_allclose(loaded.count(x).numpy(), np.full((2, 3), 3.0))


def test_a_size_the_trace_needs_as_a_number_asks_for_a_fixed_signature(tmp_path):
    model = keras.Sequential([
        keras.Input((7,), dtype="int32"),
        keras.layers.Embedding(20, 4),
        keras.layers.LSTM(5),
    ])
    with pytest.raises(ValueError, match="fixed batch size"):
        model.export(str(tmp_path / "open"), verbose=False)
    assert not (tmp_path / "open").exists()

    x = np.random.default_rng(2).integers(0, 20, (3, 7)).astype("int32")
    expected = model.predict(x, verbose=0)
    archive = keras.export.ExportArchive()
    archive.track(model)
    archive.add_endpoint("serve", model.call,
                         input_signature=[keras.InputSpec(shape=(3, 7), dtype="int32")])
    archive.write_out(str(tmp_path / "fixed"), verbose=False)
    loaded = tf.saved_model.load(str(tmp_path / "fixed"))
    np.testing.assert_allclose(loaded.serve(x).numpy(), expected, atol=1e-5)


def test_a_fresh_tensorflow_process_loads_and_runs_it(tmp_path, serve_in_fresh_tensorflow):
    model = _conv_model()
    x = np.random.default_rng(3).random((4, 8, 8, 3)).astype("float32")
    expected = model.predict(x, verbose=0)
    model.export(str(tmp_path / "model"), verbose=False)
    served = serve_in_fresh_tensorflow(tmp_path / "model", [x])
    np.testing.assert_allclose(served, expected, atol=1e-5)