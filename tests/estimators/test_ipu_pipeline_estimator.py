"""IPUPipelineEstimator (issue 12, item 1): the model_fn's stages run as a
functional pipeline per loop; weights as a pipeline computes them."""

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

import keras_ipu as ipu  # noqa: E402
from keras_ipu import ipu_pipeline_estimator  # noqa: E402
from keras_ipu import ipu_run_config  # noqa: E402
from keras_ipu.estimators import export as estimator_export  # noqa: E402
from keras_ipu.estimators.spec import ModeKeys  # noqa: E402
from keras_ipu.ops import pipelining_ops  # noqa: E402

from test_functional_pipeline import GAC, LR, MB, X, Y, _reference  # noqa: E402


def stage1(x, y):
    w1 = tf.compat.v1.get_variable("w1", shape=(4, 3),
                                   initializer=tf.compat.v1.constant_initializer(0.1))
    return tf.tanh(tf.matmul(x, w1)), y


def stage2(h, y):
    w2 = tf.compat.v1.get_variable("w2", shape=(3, 1),
                                   initializer=tf.compat.v1.constant_initializer(0.2))
    pred = tf.matmul(h, w2)
    return tf.reduce_mean(tf.square(pred - y)), pred, y


def model_fn(mode):
    def optimizer_function(loss, pred, y):
        return pipelining_ops.OptimizerFunctionOutput(
            tf.compat.v1.train.GradientDescentOptimizer(LR), loss)

    def eval_metrics_fn(loss, pred, y):
        return {"loss": loss, "mse": tf.compat.v1.metrics.mean_squared_error(y, pred)}

    stages = [stage1, stage2] if mode != ModeKeys.PREDICT else [
        stage1, lambda h, y: stage2(h, y)[1]]
    return ipu_pipeline_estimator.IPUPipelineEstimatorSpec(
        mode, computational_stages=stages, gradient_accumulation_count=GAC,
        optimizer_function=optimizer_function, eval_metrics_fn=eval_metrics_fn,
        device_mapping=[0, 1])


def input_fn():
    return tf.data.Dataset.from_tensor_slices((X, Y)).batch(MB, drop_remainder=True).repeat()


def run_config(model_dir, ipl, replicas=1):
    """The two stages' IPUs times `replicas`."""
    options = ipu.config.IPUConfig()
    options.auto_select_ipus = 2 * replicas
    return ipu_run_config.RunConfig(
        ipu_run_config=ipu_run_config.IPURunConfig(
            iterations_per_loop=ipl, num_shards=2, num_replicas=replicas, ipu_options=options),
        model_dir=str(model_dir))


def test_pipeline_estimator_trains_evaluates_and_predicts(tmp_path):
    config = run_config(tmp_path, 8)
    estimator = ipu_pipeline_estimator.IPUPipelineEstimator(model_fn, config=config)
    estimator.train(input_fn, steps=16)  # 16 mini-batches: 4 weight updates
    w1, w2, _ = _reference(4)
    assert estimator.get_variable_value("global_step") == 16
    np.testing.assert_allclose(estimator.get_variable_value("w1"), w1, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(estimator.get_variable_value("w2"), w2, rtol=1e-5, atol=1e-6)

    results = estimator.evaluate(input_fn, steps=8)
    pred = np.tanh(X @ w1) @ w2
    np.testing.assert_allclose(results["mse"], np.mean((pred - Y) ** 2), rtol=1e-5)
    np.testing.assert_allclose(results["loss"], np.mean((pred - Y) ** 2), rtol=1e-5)

    features = lambda: tf.data.Dataset.from_tensor_slices((X, Y)).batch(MB, drop_remainder=True)  # noqa: E731
    outputs = np.stack(list(estimator.predict(features)))
    np.testing.assert_allclose(outputs, pred, rtol=1e-5, atol=1e-6)

    # The SavedModel export: the PREDICT stages one after the other on the
    # serving features (named after the first stage's arguments).
    receiver_fn = estimator_export.build_raw_serving_input_receiver_fn(
        {"x": tf.zeros([1, X.shape[1]]), "y": tf.zeros([1, Y.shape[1]])}, default_batch_size=MB)
    path = estimator.export_saved_model(str(tmp_path / "exports"), receiver_fn)
    served = tf.saved_model.load(path).signatures["serving_default"](
        x=tf.constant(X[MB:2 * MB]), y=tf.constant(Y[MB:2 * MB]))
    np.testing.assert_allclose(served["output"].numpy(), pred[MB:2 * MB], rtol=1e-5, atol=1e-6)


def test_pipeline_estimator_checks_graphcore_rules(tmp_path):
    config = run_config(tmp_path, 6)
    estimator = ipu_pipeline_estimator.IPUPipelineEstimator(model_fn, config=config)
    with pytest.raises(ValueError, match=r"must be divisible by `gradient_accumulation_count` \(got 4\)"):
        estimator.train(input_fn, steps=6)
    with pytest.raises(ValueError, match="must contain `optimizer_function` when training"):
        ipu_pipeline_estimator.IPUPipelineEstimatorSpec(ModeKeys.TRAIN, [stage1],
                                                        gradient_accumulation_count=2)
