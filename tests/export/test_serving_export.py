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


# -- export_pipeline ------------------------------------------------------------

V = tf.Variable(np.linspace(-1.0, 1.0, 12, dtype=np.float32).reshape(4, 3))


def _stage1(scale, x):
    return tf.nn.relu(tf.matmul(x, V)) * scale, x


def _stage2(h, x):
    return tf.reduce_sum(h, axis=1), tf.reduce_max(x, axis=1)


def test_export_pipeline_serves_every_stage_in_a_fresh_process(tmp_path,
                                                               serve_in_fresh_tensorflow):
    x = np.random.default_rng(1).random((2, 4)).astype("float32")
    path = tmp_path / "pipelined"
    # The signature describes the first stage's arguments: `inputs` first.
    predict = ipu.serving.export_pipeline(
        [_stage1, _stage2], str(path), iterations=4, inputs=[3.0], device_mapping=[1, 0],
        predict_step_signature=[tf.TensorSpec((), tf.float32), tf.TensorSpec((2, 4), tf.float32)],
        output_names=["total", "peak"], postprocessing_step=lambda t, p: (t + 1.0, p))
    expected_total = 3.0 * np.maximum(x @ V.numpy(), 0).sum(1) + 1.0
    served = serve_in_fresh_tensorflow(path, [x], endpoint="signature:serving_default")
    np.testing.assert_allclose(served["total"], expected_total, rtol=1e-6)
    np.testing.assert_allclose(served["peak"], x.max(1), rtol=1e-6)
    np.testing.assert_allclose(predict(tf.constant(x))["total"].numpy(), expected_total,
                               rtol=1e-6)


def test_export_pipeline_takes_the_signature_of_a_dataset_or_a_preprocessing_step(tmp_path):
    x = np.random.default_rng(2).random((2, 4)).astype("float32")
    dataset = tf.data.Dataset.from_tensor_slices(np.stack([x, x])).batch(2, drop_remainder=True)
    dataset = dataset.map(lambda b: b[0])  # elements of shape (2, 4)
    ipu.serving.export_pipeline([_stage1, _stage2], str(tmp_path / "ds"), iterations=2,
                                inputs=[1.0], input_dataset=dataset)
    served = tf.saved_model.load(str(tmp_path / "ds")).signatures["serving_default"](
        tf.constant(x))
    np.testing.assert_allclose(served["output_0"].numpy(), np.maximum(x @ V.numpy(), 0).sum(1),
                               rtol=1e-6)

    ipu.serving.export_pipeline(
        [_stage1, _stage2], str(tmp_path / "pre"), iterations=2, inputs=[1.0],
        preprocessing_step=lambda s: tf.strings.to_number(s, tf.float32),
        preprocessing_step_signature=[tf.TensorSpec((2, 4), tf.string)])
    strings = tf.constant(x.astype(str))
    served = tf.saved_model.load(str(tmp_path / "pre")).signatures["serving_default"](strings)
    np.testing.assert_allclose(served["output_1"].numpy(), x.max(1), rtol=1e-6)


def test_export_pipeline_checks_the_pipeline(tmp_path):
    spec = [tf.TensorSpec((), tf.float32), tf.TensorSpec((2, 4), tf.float32)]
    with pytest.raises(ValueError, match="must be a multiple of 2, but it is 3"):
        ipu.serving.export_pipeline([_stage1, _stage2], str(tmp_path / "a"), iterations=3,
                                    inputs=[1.0], predict_step_signature=spec)
    with pytest.raises(ValueError, match="3 mappings != 2 stages"):
        ipu.serving.export_pipeline([_stage1, _stage2], str(tmp_path / "b"), iterations=4,
                                    inputs=[1.0], device_mapping=[0, 1, 2],
                                    predict_step_signature=spec)
    with pytest.raises(ValueError, match="at least two computational stages"):
        ipu.serving.export_pipeline([_stage1], str(tmp_path / "c"), iterations=4,
                                    inputs=[1.0], predict_step_signature=spec)
    with pytest.raises(TypeError, match="PipelineStageOptions"):
        ipu.serving.export_pipeline([_stage1, _stage2], str(tmp_path / "d"), iterations=4,
                                    inputs=[1.0], poplar_options=[{}, {}],
                                    predict_step_signature=spec)
    assert not os.listdir(tmp_path)  # nothing half written
