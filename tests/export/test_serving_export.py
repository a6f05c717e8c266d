"""serving.export_single_step (issue 12, item 5): the predict step as the
front end compiles it, emitted into a SavedModel with frozen variables,
served by TensorFlow with the numbers the simulated IPU gives."""

import os

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

import keras_ipu as ipu  # noqa: E402

W = tf.Variable(np.arange(12, dtype=np.float32).reshape(4, 3) / 10)


@tf.function(input_signature=[tf.TensorSpec((2, 4), tf.float32)])
def predict_step(x):
    return tf.nn.softmax(tf.matmul(x, W)), tf.reduce_sum(x, axis=1)


def test_export_single_step_serves_the_ipu_numbers(tmp_path):
    x = np.random.default_rng(0).random((2, 4)).astype("float32")
    on_ipu = ipu.ipu_compiler.compile(predict_step, inputs=[tf.constant(x)])
    path = str(tmp_path / "served")
    predict = ipu.serving.export_single_step(predict_step, path, iterations=16,
                                             output_names=["probabilities", "sums"],
                                             postprocessing_step=lambda p, s: (p * 2.0, s))
    loaded = tf.saved_model.load(path)
    out = loaded.signatures["serving_default"](tf.constant(x))
    np.testing.assert_allclose(out["probabilities"].numpy(), 2.0 * on_ipu[0].numpy(), rtol=1e-6)
    np.testing.assert_allclose(out["sums"].numpy(), on_ipu[1].numpy(), rtol=1e-6)
    np.testing.assert_allclose(predict(tf.constant(x))["sums"].numpy(), x.sum(1), rtol=1e-6)
    # The variables are frozen: changing W later changes nothing served.
    W.assign(W * 0.0)
    again = tf.saved_model.load(path).signatures["serving_default"](tf.constant(x))
    np.testing.assert_allclose(again["sums"].numpy(), x.sum(1), rtol=1e-6)
    W.assign(np.arange(12, dtype=np.float32).reshape(4, 3) / 10)
    assert not [f for f in os.listdir(tmp_path) if f.startswith(".served")]


def test_export_single_step_checks_its_arguments(tmp_path):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "file").write_text("x")
    with pytest.raises(ValueError, match="is not empty"):
        ipu.serving.export_single_step(predict_step, str(tmp_path / "full"), 4)
    with pytest.raises(ValueError, match="iterations must be a positive integer"):
        ipu.serving.export_single_step(predict_step, str(tmp_path / "a"), 0)
    with pytest.raises(TypeError, match="tf.TensorSpec"):
        ipu.serving.export_single_step(lambda x: x, str(tmp_path / "b"), 4,
                                       predict_step_signature=[(2, 4)])
    with pytest.raises(NotImplementedError, match="tf.Session"):
        ipu.serving.export_single_step(predict_step, str(tmp_path / "c"), 4,
                                       variable_initializer=lambda session: None)
