"""experimental_export_all_saved_models' TRAIN and EVAL graphs (issue 12):
one SavedModel with a MetaGraph per mode, as TensorFlow 1's estimator
wrote it, run by a fresh TensorFlow process with TensorFlow's own TF1
loader (no keras_ipu): the EVAL signature gives evaluate()'s loss and
metrics on the same batch, the TRAIN graph's train op makes the step
train() makes; for IPUEstimator and IPUPipelineEstimator."""

import os

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

import keras_ipu as ipu  # noqa: E402
from keras_ipu import ipu_estimator  # noqa: E402
from keras_ipu import ipu_pipeline_estimator  # noqa: E402
from keras_ipu import ipu_run_config  # noqa: E402
from keras_ipu.estimators import export as estimator_export  # noqa: E402
from keras_ipu.estimators import tf_estimator  # noqa: E402
from keras_ipu.gradient_accumulation import GradientAccumulationReductionMethod  # noqa: E402
from keras_ipu.ops import pipelining_ops  # noqa: E402

ModeKeys = ipu_estimator.ModeKeys
RNG = np.random.default_rng(7)
X = RNG.random((32, 4)).astype("float32")
Y = X @ np.array([[1.0], [-2.0], [3.0], [0.5]], "float32") + 0.25
BATCH = 8


def dataset(x, y, batch):
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(batch, drop_remainder=True).repeat()


def model_fn(features, labels, mode, params):
    w = tf.compat.v1.get_variable("w", shape=(4, 1), initializer=tf.compat.v1.zeros_initializer())
    b = tf.compat.v1.get_variable("b", shape=(1,), initializer=tf.compat.v1.ones_initializer())
    pred = tf.matmul(features, w) + b
    if mode == ModeKeys.PREDICT:
        return tf_estimator.EstimatorSpec(mode, predictions=pred)
    loss = tf.reduce_mean(tf.square(pred - labels))
    if mode == ModeKeys.EVAL:
        metrics = {"mae": tf.compat.v1.metrics.mean_absolute_error(labels, pred),
                   "mean_pred": tf.compat.v1.metrics.mean(pred)}
        return tf_estimator.EstimatorSpec(mode, loss=loss, eval_metric_ops=metrics)
    # Momentum keeps a slot per weight: the TRAIN graph must carry it.
    train_op = tf.compat.v1.train.MomentumOptimizer(0.05, 0.9).minimize(loss)
    return tf_estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


def make_estimator(model_dir):
    run_config = ipu_run_config.RunConfig(
        ipu_run_config=ipu_run_config.IPURunConfig(iterations_per_loop=1),
        model_dir=str(model_dir), save_checkpoints_steps=1000)
    return ipu_estimator.IPUEstimator(model_fn, config=run_config, train_batch_size=BATCH,
                                      eval_batch_size=BATCH, predict_batch_size=BATCH)


def supervised_receiver():
    return estimator_export.build_raw_supervised_input_receiver_fn(
        tf.zeros([1, 4]), tf.zeros([1, 1]))


def serving_receiver():
    x = tf.compat.v1.placeholder(tf.float32, [None, 4], name="x")
    return estimator_export.TensorServingInputReceiver(x, {"x": x})


EVAL_X, EVAL_Y = X[8:16], Y[8:16]
TRAIN_X, TRAIN_Y = X[16:24], Y[16:24]
NAMES = ("w", "b", "w/Momentum", "b/Momentum", "global_step")


# The pipeline estimator: two stages on two IPUs, 4 micro-batches of 4 per
# weight update, averaged.
MB, GAC = 4, 4


def stage1(x, y):
    w1 = tf.compat.v1.get_variable("w1", shape=(4, 3),
                                   initializer=tf.compat.v1.constant_initializer(0.1))
    return tf.tanh(tf.matmul(x, w1)), y


def stage2(h, y):
    w2 = tf.compat.v1.get_variable("w2", shape=(3, 1),
                                   initializer=tf.compat.v1.constant_initializer(0.2))
    pred = tf.matmul(h, w2)
    return tf.reduce_mean(tf.square(pred - y)), pred, y


def pipeline_model_fn(mode):
    def optimizer_function(loss, pred, y):
        return pipelining_ops.OptimizerFunctionOutput(
            tf.compat.v1.train.GradientDescentOptimizer(0.1), loss)

    def eval_metrics_fn(loss, pred, y):
        return {"loss": loss, "mae": tf.compat.v1.metrics.mean_absolute_error(y, pred)}

    return ipu_pipeline_estimator.IPUPipelineEstimatorSpec(
        mode, computational_stages=[stage1, stage2], gradient_accumulation_count=GAC,
        optimizer_function=optimizer_function, eval_metrics_fn=eval_metrics_fn,
        device_mapping=[0, 1], reduction_method=GradientAccumulationReductionMethod.MEAN)


def make_pipeline_estimator(model_dir):
    options = ipu.config.IPUConfig()
    options.auto_select_ipus = 2
    return ipu_pipeline_estimator.IPUPipelineEstimator(
        pipeline_model_fn, config=ipu_run_config.RunConfig(
            ipu_run_config=ipu_run_config.IPURunConfig(
                iterations_per_loop=GAC, num_shards=2, ipu_options=options),
            model_dir=str(model_dir)))


def pipeline_dataset(x, y):
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(MB, drop_remainder=True).repeat()


@pytest.fixture(scope="module")
def exported(tmp_path_factory, run_tf1_in_fresh_tensorflow):
    """Each estimator trained and exported. One fresh TensorFlow process
    runs the EVAL signatures twice on an evaluation batch and the TRAIN
    graphs on a training batch; then each estimator evaluates on the
    evaluation batch and trains on the training batch from the same
    checkpoint. Returns {"plain" / "pipeline": (path, eval run, train run,
    checkpoint values, evaluate()'s results, values after train()[, the
    train run by TensorFlow 2's loader])}."""
    estimator = make_estimator(tmp_path_factory.mktemp("estimator"))
    estimator.train(lambda params: dataset(X, Y, params["batch_size"]), steps=3)
    path = os.fsdecode(estimator.experimental_export_all_saved_models(
        str(tmp_path_factory.mktemp("exports")),
        {ModeKeys.TRAIN: supervised_receiver(), ModeKeys.EVAL: supervised_receiver(),
         ModeKeys.PREDICT: serving_receiver}))
    piped = make_pipeline_estimator(tmp_path_factory.mktemp("pipeline_estimator"))
    piped.train(lambda: pipeline_dataset(X, Y), steps=2 * GAC)
    receiver = estimator_export.build_raw_supervised_input_receiver_fn(
        tf.zeros([1, 4]), tf.zeros([1, 1]), default_batch_size=MB)
    piped_path = os.fsdecode(piped.experimental_export_all_saved_models(
        str(tmp_path_factory.mktemp("pipeline_exports")),
        {ModeKeys.TRAIN: receiver, ModeKeys.EVAL: receiver}))
    runs = run_tf1_in_fresh_tensorflow([
        (path, "eval", "eval", {"input": EVAL_X, "label": EVAL_Y}, 2),
        (path, "train", "train", {"input": TRAIN_X, "label": TRAIN_Y}, 2),
        (path, "train", "train", {"input": TRAIN_X, "label": TRAIN_Y}, 2, "tf2"),
        (piped_path, "eval", "eval", {"input": EVAL_X[:MB], "label": EVAL_Y[:MB]}, 1),
        (piped_path, "train", "train", {"input": TRAIN_X[:MB], "label": TRAIN_Y[:MB]}, 1)])
    checkpoint = {n: estimator.get_variable_value(n) for n in NAMES}
    evaluated = estimator.evaluate(
        lambda params: dataset(EVAL_X, EVAL_Y, params["batch_size"]), steps=1)
    estimator.train(lambda params: dataset(TRAIN_X, TRAIN_Y, params["batch_size"]), steps=2)
    trained = {n: estimator.get_variable_value(n) for n in NAMES}
    piped_names = ("w1", "w2", "global_step")
    piped_checkpoint = {n: piped.get_variable_value(n) for n in piped_names}
    # The evaluation batch in both micro-batches of a loop: the same mean.
    piped_evaluated = piped.evaluate(lambda: pipeline_dataset(EVAL_X[:MB], EVAL_Y[:MB]),
                                     steps=GAC)
    # One weight update over GAC micro-batches that are all the training batch.
    piped.train(lambda: pipeline_dataset(TRAIN_X[:MB], TRAIN_Y[:MB]), steps=GAC)
    piped_trained = {n: piped.get_variable_value(n) for n in piped_names}
    return {"plain": (path, runs[0], runs[1], checkpoint, evaluated, trained, runs[2]),
            "pipeline": (piped_path, runs[3], runs[4], piped_checkpoint, piped_evaluated,
                         piped_trained)}


def test_one_saved_model_with_a_meta_graph_per_mode(exported):
    from tensorflow.python.saved_model import loader_impl

    path = exported["plain"][0]
    metas = loader_impl.parse_saved_model(path).meta_graphs
    assert [list(m.meta_info_def.tags) for m in metas] == [["train"], ["eval"], ["serve"]]
    assert sorted(metas[0].signature_def) == ["train"]
    assert sorted(metas[1].signature_def) == ["eval"]
    assert sorted(metas[1].signature_def["eval"].outputs) == [
        "loss", "metrics/mae/update_op", "metrics/mae/value", "metrics/mean_pred/update_op",
        "metrics/mean_pred/value"]
    assert sorted(metas[1].signature_def["eval"].inputs) == ["input", "label"]
    # The TRAIN graph saved the variables (weights, Momentum's slots, the
    # step) with the checkpoint's values.
    reader = tf.train.load_checkpoint(os.path.join(path, "variables", "variables"))
    assert set(reader.get_variable_to_shape_map()) == set(NAMES)
    for name, value in exported["plain"][3].items():
        np.testing.assert_array_equal(reader.get_tensor(name), value)


def test_eval_signature_gives_evaluates_loss_and_metrics(exported):
    _, ran, _, checkpoint, evaluated, _, _ = exported["plain"]
    assert not ran["train_op"]
    first, second = ran["runs"]
    np.testing.assert_allclose(first["loss"], evaluated["loss"], rtol=1e-6)
    for name in ("mae", "mean_pred"):
        np.testing.assert_allclose(first[f"metrics/{name}/update_op"], evaluated[name], rtol=1e-6)
        np.testing.assert_allclose(first[f"metrics/{name}/value"], evaluated[name], rtol=1e-6)
    # By hand from the checkpoint's weights.
    pred = EVAL_X @ checkpoint["w"] + checkpoint["b"]
    np.testing.assert_allclose(first["loss"], np.mean((pred - EVAL_Y) ** 2), rtol=1e-5)
    np.testing.assert_allclose(first["metrics/mae/value"], np.mean(np.abs(pred - EVAL_Y)),
                               rtol=1e-5)
    # The accumulators are local variables: the same batch again keeps the
    # mean, and the accumulators (TF1's total and count) doubled.
    np.testing.assert_allclose(second["metrics/mae/value"], evaluated["mae"], rtol=1e-6)
    assert "mae/total" not in ran["variables"]


def test_train_op_makes_the_steps_train_makes(exported):
    _, _, ran, checkpoint, _, trained, ran_tf2 = exported["plain"]
    assert ran["train_op"]
    after = ran["variables"]
    for name in NAMES:
        np.testing.assert_allclose(after[name], trained[name], rtol=1e-5, atol=1e-7,
                                   err_msg=name)
    assert int(after["global_step"]) == 5
    # By hand: Momentum (lr 0.05, 0.9) on the mean squared error; each run's
    # loss is of the weights before its step.
    w, b = checkpoint["w"], checkpoint["b"]
    mw, mb = checkpoint["w/Momentum"], checkpoint["b/Momentum"]
    for run in ran["runs"]:
        error = TRAIN_X @ w + b - TRAIN_Y
        np.testing.assert_allclose(run["loss"], np.mean(error ** 2), rtol=1e-5)
        mw = 0.9 * mw + 2.0 * TRAIN_X.T @ error / BATCH
        mb = 0.9 * mb + 2.0 * error.sum(axis=0) / BATCH
        w, b = w - 0.05 * mw, b - 0.05 * mb
    np.testing.assert_allclose(after["w"], w, rtol=1e-5)
    np.testing.assert_allclose(after["b/Momentum"], mb, rtol=1e-5)
    # TensorFlow 2's loader reads no train op collection: each call of the
    # signature is the step all the same.
    for name in NAMES:
        np.testing.assert_allclose(ran_tf2["variables"][name], after[name], rtol=1e-6,
                                   err_msg=name)
    for tf1_run, tf2_run in zip(ran["runs"], ran_tf2["runs"]):
        np.testing.assert_allclose(tf2_run["loss"], tf1_run["loss"], rtol=1e-6)


def test_pipeline_estimator_eval_and_train_graphs(exported):
    path, ran_eval, ran_train, checkpoint, evaluated, trained = exported["pipeline"]
    from tensorflow.python.saved_model import loader_impl

    metas = loader_impl.parse_saved_model(path).meta_graphs
    assert [list(m.meta_info_def.tags) for m in metas] == [["train"], ["eval"]]
    (first,) = ran_eval["runs"]
    np.testing.assert_allclose(first["loss"], evaluated["loss"], rtol=1e-6)
    np.testing.assert_allclose(first["metrics/mae/value"], evaluated["mae"], rtol=1e-6)
    x, y = EVAL_X[:MB], EVAL_Y[:MB]
    pred = np.tanh(x @ checkpoint["w1"]) @ checkpoint["w2"]
    np.testing.assert_allclose(first["metrics/mae/value"], np.mean(np.abs(pred - y)), rtol=1e-5)
    # One run of the TRAIN graph: the update train() makes from GAC equal
    # micro-batches averaged; the global step counts the one micro-batch.
    after = ran_train["variables"]
    for name in ("w1", "w2"):
        np.testing.assert_allclose(after[name], trained[name], rtol=1e-5, atol=1e-7,
                                   err_msg=name)
        assert not np.allclose(after[name], checkpoint[name])
    assert int(after["global_step"]) == checkpoint["global_step"] + 1
    assert trained["global_step"] == checkpoint["global_step"] + GAC
