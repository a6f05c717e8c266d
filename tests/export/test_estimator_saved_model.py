"""IPUEstimator.export_saved_model (issue 12): the model_fn's PREDICT graph
with the checkpoint's values, compiled through the front end and emitted
as TensorFlow ops under export_dir_base/<timestamp>; served by a fresh
TensorFlow process with predict()'s numbers; written atomically."""

import os

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from keras_ipu import ipu_estimator  # noqa: E402
from keras_ipu import ipu_pipeline_estimator  # noqa: E402
from keras_ipu import ipu_run_config  # noqa: E402
from keras_ipu.estimators import export as estimator_export  # noqa: E402
from keras_ipu.estimators import tf_estimator  # noqa: E402

ModeKeys = ipu_estimator.ModeKeys
RNG = np.random.default_rng(3)
X = RNG.random((32, 4)).astype("float32")
Y = X @ np.array([[1.0], [-2.0], [3.0], [0.5]], "float32") + 0.25
BATCH = 8


def input_fn(params):
    return tf.data.Dataset.from_tensor_slices((X, Y)).batch(
        params["batch_size"], drop_remainder=True).repeat()


def features_only(params):
    return tf.data.Dataset.from_tensor_slices(X).batch(params["batch_size"], drop_remainder=True)


def model_fn(features, labels, mode, params):
    x = features["x"] if isinstance(features, dict) else features
    w = tf.compat.v1.get_variable("w", shape=(4, 1), initializer=tf.compat.v1.zeros_initializer())
    b = tf.compat.v1.get_variable("b", shape=(1,), initializer=tf.compat.v1.zeros_initializer())
    pred = tf.matmul(x, w) + b
    if mode == ModeKeys.PREDICT:
        exports = None
        if params.get("export_outputs"):
            exports = {"serving_default": estimator_export.PredictOutput({"y": pred}),
                       "regress": estimator_export.RegressionOutput(pred[:, 0] * 2.0)}
        return tf_estimator.EstimatorSpec(mode, predictions={"y": pred, "twice": 2.0 * pred},
                                          export_outputs=exports)
    loss = tf.reduce_mean(tf.square(pred - labels))
    train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss)
    return tf_estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    run_config = ipu_run_config.RunConfig(
        ipu_run_config=ipu_run_config.IPURunConfig(iterations_per_loop=4),
        model_dir=str(tmp_path_factory.mktemp("estimator")), save_checkpoints_steps=4)
    estimator = ipu_estimator.IPUEstimator(model_fn, config=run_config, params={},
                                           train_batch_size=BATCH, predict_batch_size=BATCH)
    estimator.train(input_fn, steps=8)
    predicted = np.stack([p["y"] for p in estimator.predict(features_only)])
    return estimator, predicted


def _tensor_receiver():
    x = tf.compat.v1.placeholder(tf.float32, [None, 4], name="x")
    return estimator_export.TensorServingInputReceiver(x, {"x": x})


def test_export_serves_predict_numbers_in_a_fresh_tensorflow(trained, tmp_path,
                                                             serve_in_fresh_tensorflow):
    estimator, predicted = trained
    base = tmp_path / "exports"
    path = estimator.export_saved_model(str(base), _tensor_receiver)
    # tf.estimator's answer: bytes naming export_dir_base/<timestamp>.
    assert isinstance(path, bytes)
    assert os.path.dirname(path) == os.fsencode(base)
    assert os.path.basename(path).isdigit()
    assert os.listdir(base) == [os.fsdecode(os.path.basename(path))]
    # The open batch dimension took predict_batch_size: one batch per call.
    served = serve_in_fresh_tensorflow(os.fsdecode(path), [X[8:16]],
                                       endpoint="signature:serving_default:x")
    assert set(served) == {"y", "twice"}
    np.testing.assert_allclose(served["y"], predicted[8:16], rtol=1e-6)
    np.testing.assert_allclose(served["twice"], 2.0 * predicted[8:16], rtol=1e-6)
    # The training weights of the estimator are not those of an untrained model.
    assert np.abs(predicted).max() > 0.1


def test_parsing_receiver_and_export_outputs_give_tensorflow_1_signatures(trained, tmp_path):
    estimator, predicted = trained
    estimator._params["export_outputs"] = True  # noqa: SLF001 - the model_fn's switch
    try:
        spec = {"x": tf.io.FixedLenFeature([4], tf.float32)}
        receiver_fn = estimator_export.build_parsing_serving_input_receiver_fn(
            spec, default_batch_size=BATCH)
        with pytest.warns(DeprecationWarning, match="export_saved_model"):
            path = estimator.export_savedmodel(str(tmp_path), receiver_fn)
    finally:
        estimator._params.pop("export_outputs")  # noqa: SLF001
    examples = [tf.train.Example(features=tf.train.Features(feature={
        "x": tf.train.Feature(float_list=tf.train.FloatList(value=row))})).SerializeToString()
        for row in X[:BATCH]]
    loaded = tf.saved_model.load(os.fsdecode(path))
    assert sorted(loaded.signatures) == ["regress", "serving_default"]
    out = loaded.signatures["serving_default"](examples=tf.constant(examples))
    assert set(out) == {"y"}
    np.testing.assert_allclose(out["y"].numpy(), predicted[:BATCH], rtol=1e-6)
    regressed = loaded.signatures["regress"](inputs=tf.constant(examples))
    np.testing.assert_allclose(regressed["outputs"].numpy(), 2.0 * predicted[:BATCH, 0],
                               rtol=1e-6)
    # TensorFlow 1's method names, which TensorFlow Serving's APIs check.
    from tensorflow.python.saved_model import loader_impl

    meta = loader_impl.parse_saved_model(os.fsdecode(path)).meta_graphs[0]
    assert meta.signature_def["regress"].method_name == "tensorflow/serving/regress"
    assert meta.signature_def["serving_default"].method_name == "tensorflow/serving/predict"


def test_a_failed_export_leaves_nothing_behind(trained, tmp_path):
    estimator, _ = trained
    base = tmp_path / "exports"
    # assets_extra's copy fails after the SavedModel was written to its
    # temporary directory.
    with pytest.raises(FileNotFoundError):
        estimator.export_saved_model(str(base), _tensor_receiver,
                                     assets_extra={"vocab.txt": str(tmp_path / "missing")})
    assert not base.exists() or os.listdir(base) == []

    def open_shape():
        x = tf.compat.v1.placeholder(tf.float32, [BATCH, None], name="x")
        return estimator_export.TensorServingInputReceiver(x, x)

    with pytest.raises(ValueError, match="static shapes"):
        estimator.export_saved_model(str(base), open_shape)
    assert not base.exists() or os.listdir(base) == []
    source = tmp_path / "vocab"
    source.write_text("a\nb\n")
    path = estimator.export_saved_model(str(base), _tensor_receiver,
                                        assets_extra={"extra/vocab.txt": str(source)})
    assert (open(os.path.join(os.fsdecode(path), "assets.extra", "extra", "vocab.txt")).read()
            == "a\nb\n")


def test_export_checks_as_tensorflow_1_did(trained, tmp_path):
    estimator, _ = trained
    with pytest.raises(ValueError, match="An input_receiver_fn must be defined"):
        estimator.export_saved_model(str(tmp_path), None)
    # A TRAIN or EVAL graph needs labels too; nothing is left half written.
    with pytest.raises(TypeError, match="SupervisedInputReceiver"):
        estimator.experimental_export_all_saved_models(
            str(tmp_path / "modes"), {ModeKeys.TRAIN: _tensor_receiver})
    assert not (tmp_path / "modes").exists() or os.listdir(tmp_path / "modes") == []
    with pytest.raises(ValueError, match="Unknown mode 'fit'"):
        estimator.experimental_export_all_saved_models(str(tmp_path), {"fit": _tensor_receiver})
    with pytest.raises(TypeError, match="ServingInputReceiver"):
        estimator.export_saved_model(str(tmp_path), lambda: {"x": 1})
    with pytest.raises(ValueError, match="receiver_tensor keys must be strings"):
        estimator_export.ServingInputReceiver(tf.zeros([1]), {1: tf.zeros([1])})
    untrained = ipu_estimator.IPUEstimator(
        model_fn, config=ipu_run_config.RunConfig(model_dir=str(tmp_path / "empty")))
    with pytest.raises(ValueError, match="Couldn't find trained model"):
        untrained.export_saved_model(str(tmp_path), _tensor_receiver)
    # What Graphcore's scripts reach as tf.estimator.export (the hook makes
    # the shim TensorFlow's tf.estimator).
    assert tf_estimator.export is estimator_export
    # The raw receiver: one placeholder per feature, in a dict.
    receiver_fn = estimator_export.build_raw_serving_input_receiver_fn(
        {"x": tf.zeros([1, 4])}, default_batch_size=3)
    with tf.Graph().as_default():
        receiver = receiver_fn()
    assert receiver.features.keys() == receiver.receiver_tensors.keys() == {"x"}
    assert receiver.features["x"].shape.as_list() == [3, 4]
    # The supervised receivers of TRAIN and EVAL exports, as TensorFlow 1's:
    # from an input_fn's (features, labels) elements, batch left open.
    receiver_fn = estimator_export.build_supervised_input_receiver_fn_from_input_fn(
        input_fn, params={"batch_size": 5})
    with tf.Graph().as_default():
        receiver = receiver_fn()
    assert isinstance(receiver, estimator_export.SupervisedInputReceiver)
    assert sorted(receiver.receiver_tensors) == ["input", "label"]
    assert receiver.features.shape.as_list() == [None, 4]
    assert receiver.labels.shape.as_list() == [None, 1]
    with pytest.raises(ValueError, match="distinct keys. Found overlapping keys: {'x'}"):
        estimator_export.build_raw_supervised_input_receiver_fn(
            {"x": tf.zeros([1, 4])}, {"x": tf.zeros([1])})
    with pytest.raises(ValueError, match="label must be a Tensor or SparseTensor"):
        estimator_export.SupervisedInputReceiver(tf.zeros([1]), [1.0], {"x": tf.zeros([1])})


def test_an_older_checkpoint_exports_without_rewinding_the_estimator(trained, tmp_path):
    estimator, predicted = trained
    first = os.path.join(estimator.model_dir, "model.ckpt-4")
    path = estimator.export_saved_model(str(tmp_path), _tensor_receiver, checkpoint_path=first)
    served = tf.saved_model.load(os.fsdecode(path)).signatures["serving_default"](
        x=tf.constant(X[:BATCH]))["y"].numpy()
    reader = tf.train.load_checkpoint(first)
    expected = X[:BATCH] @ reader.get_tensor("w") + reader.get_tensor("b")
    np.testing.assert_allclose(served, expected, rtol=1e-6)
    assert not np.allclose(served, predicted[:BATCH])
    # The estimator's own variables hold the latest values again.
    live = estimator._store.saveable()  # noqa: SLF001 - what training continues from
    np.testing.assert_array_equal(live["w"].numpy(), estimator.get_variable_value("w"))
