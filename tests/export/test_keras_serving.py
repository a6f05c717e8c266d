"""Keras' export_for_ipu_serving and serving.export_keras (issue 12, item
5): a model made in an IPUStrategy scope, pipelined or not, written as a
SavedModel with frozen weights for one batch size; plain TensorFlow in a
fresh process serves the numbers keras_ipu predicts. Under
KERAS_BACKEND=tensorflow (a subprocess: this session runs the ipu backend)
the tf.keras model goes through the TensorFlow front end."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import keras

tf = pytest.importorskip("tensorflow")

import keras_ipu as ipu  # noqa: E402

SCENARIO = Path(__file__).parent / "keras_tf_serving_scenario.py"


def _pipelined_model(batch_size=2):
    cfg = ipu.config.IPUConfig()
    cfg.auto_select_ipus = 2
    cfg.configure_ipu_system()
    strategy = ipu.ipu_strategy.IPUStrategy()
    with strategy.scope():
        a = keras.Input((4,), batch_size=batch_size, name="a")
        b = keras.Input((4,), batch_size=batch_size, name="b")
        with ipu.keras.PipelineStage(0):
            h = keras.layers.Dense(5, activation="relu")(keras.layers.Concatenate()([a, b]))
        with ipu.keras.PipelineStage(1):
            y = keras.layers.Dense(3, activation="softmax")(keras.layers.LayerNormalization()(h))
        model = keras.Model([a, b], y)
        model.set_pipelining_options(device_mapping=[1, 0])
        model.compile(steps_per_execution=4)
    return model


def test_a_pipelined_model_is_served_by_a_fresh_tensorflow(tmp_path, serve_in_fresh_tensorflow):
    model = _pipelined_model()
    rng = np.random.default_rng(0)
    xa, xb = rng.random((2, 4)).astype("float32"), rng.random((2, 4)).astype("float32")
    expected = model.predict([np.concatenate([xa] * 4), np.concatenate([xb] * 4)],
                             batch_size=2, verbose=0)[:2]
    path = tmp_path / "served"
    predict = model.export_for_ipu_serving(str(path), output_names="probabilities")
    served = serve_in_fresh_tensorflow(path, [xa, xb], endpoint="signature:serving_default:a,b")
    np.testing.assert_allclose(served["probabilities"], expected, atol=1e-6)
    np.testing.assert_allclose(predict(xa, xb)["probabilities"].numpy(), expected, atol=1e-6)
    # The weights are frozen: the served numbers do not follow later changes.
    model.layers[-1].kernel.assign(np.zeros((5, 3), "float32"))
    again = tf.saved_model.load(str(path)).signatures["serving_default"](
        a=tf.constant(xa), b=tf.constant(xb))
    np.testing.assert_allclose(again["probabilities"].numpy(), expected, atol=1e-6)


def test_export_keras_with_pre_and_postprocessing_and_a_batch_size(tmp_path):
    model = _pipelined_model(batch_size=None)
    with pytest.raises(ValueError, match="pass batch_size"):
        ipu.serving.export_keras(model, str(tmp_path / "no_batch"))
    x = np.arange(24, dtype="float32").reshape(3, 8) / 24

    def pre(text):
        values = tf.strings.to_number(text, tf.float32)
        return values[:, :4], values[:, 4:]

    ipu.serving.export_keras(
        model, str(tmp_path / "pre"), batch_size=3, preprocessing_step=pre,
        preprocessing_step_signature=[tf.TensorSpec((3, 8), tf.string)],
        postprocessing_step=lambda p: tf.argmax(p, axis=1))
    served = tf.saved_model.load(str(tmp_path / "pre")).signatures["serving_default"](
        tf.constant(x.astype(str)))
    expected = np.argmax(model([x[:, :4], x[:, 4:]]), axis=1)
    np.testing.assert_array_equal(served["output_0"].numpy(), expected)
    with pytest.raises(ValueError, match="must match the model's inputs"):
        ipu.serving.export_keras(
            model, str(tmp_path / "bad"), batch_size=2, preprocessing_step=pre,
            preprocessing_step_signature=[tf.TensorSpec((3, 8), tf.string)])


def test_export_checks_the_model(tmp_path):
    plain = keras.Sequential([keras.Input((3,), batch_size=2), keras.layers.Dense(1)])
    with pytest.raises(ValueError, match="not created inside an IPU strategy"):
        ipu.serving.export_keras(plain, str(tmp_path / "plain"))
    model = _pipelined_model()
    model.compile(steps_per_execution=3)  # not a multiple of the pipeline's 2 stages
    with pytest.raises(ValueError, match="must be a multiple of 2, but it is 3"):
        model.export_for_ipu_serving(str(tmp_path / "odd"))
    assert not os.listdir(tmp_path)


def test_a_tf_keras_model_exports_through_the_tensorflow_front_end(tmp_path):
    env = dict(os.environ, KERAS_BACKEND="tensorflow", TF_CPP_MIN_LOG_LEVEL="3")
    done = subprocess.run([sys.executable, str(SCENARIO), str(tmp_path / "tf_keras")],
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    np.testing.assert_allclose(result["served"], result["keras"], atol=1e-6)
    assert result["programs"] >= 1  # the call was compiled by the front end
