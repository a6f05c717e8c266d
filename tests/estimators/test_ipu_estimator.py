"""IPUEstimator (issue 12, item 1): tf.estimator's contract with the steps
compiled through the TensorFlow front end and run on the simulated IPU;
checkpoints in model_dir written atomically and resumed from."""

import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from keras_ipu import ipu_estimator  # noqa: E402
from keras_ipu import ipu_run_config  # noqa: E402
from keras_ipu import ipu_session_run_hooks  # noqa: E402
from keras_ipu.estimators import checkpoints  # noqa: E402

ModeKeys = ipu_estimator.ModeKeys
RNG = np.random.default_rng(0)
X = RNG.random((64, 4)).astype("float32")
TRUE_W = np.array([[1.0], [-2.0], [3.0], [0.5]], "float32")
Y = X @ TRUE_W
BATCH, LR, IPL = 8, 0.1, 4


def input_fn(params):
    return tf.data.Dataset.from_tensor_slices((X, Y)).batch(
        params["batch_size"], drop_remainder=True).repeat()


def model_fn(features, labels, mode, params):
    w = tf.compat.v1.get_variable("w", shape=(4, 1), initializer=tf.compat.v1.zeros_initializer())
    b = tf.compat.v1.get_variable("b", shape=(1,), initializer=tf.compat.v1.zeros_initializer())
    pred = tf.matmul(features, w) + b
    if mode == ModeKeys.PREDICT:
        return ipu_estimator.IPUEstimatorSpec(mode, predictions={"y": pred})
    loss = tf.reduce_mean(tf.square(pred - labels))
    if mode == ModeKeys.EVAL:
        return ipu_estimator.IPUEstimatorSpec(mode, loss=loss, eval_metric_ops={
            "mse": tf.compat.v1.metrics.mean_squared_error(labels, pred),
            "mae": tf.compat.v1.metrics.mean_absolute_error(labels, pred)})
    train_op = tf.compat.v1.train.GradientDescentOptimizer(params["lr"]).minimize(loss)
    hooks = params.get("hooks", [])
    if hooks:
        train_op = tf.group(train_op, hooks[0].log({"loss": loss}))
    return ipu_estimator.IPUEstimatorSpec(mode, loss=loss, train_op=train_op,
                                          training_hooks=hooks)


def reference(steps, start=0):
    """Plain NumPy gradient descent on the same batches: (w, b, losses)."""
    w, b, losses = np.zeros((4, 1), np.float32), np.zeros((1,), np.float32), []
    for t in range(start, start + steps):
        k = (t * BATCH) % len(X)
        x, y = X[k:k + BATCH], Y[k:k + BATCH]
        err = x @ w + b - y
        losses.append(float(np.mean(err ** 2)))
        w = w - LR * (2.0 / BATCH) * x.T @ err
        b = b - LR * (2.0 / BATCH) * err.sum(0)
    return w, b, losses


def make(model_dir, ipl=IPL, **config):
    config.setdefault("save_checkpoints_steps", 8)
    run_config = ipu_run_config.RunConfig(
        ipu_run_config=ipu_run_config.IPURunConfig(iterations_per_loop=ipl),
        model_dir=str(model_dir), **config)
    params = {"lr": LR}
    return ipu_estimator.IPUEstimator(model_fn, config=run_config, params=params,
                                      train_batch_size=BATCH, eval_batch_size=BATCH,
                                      predict_batch_size=BATCH)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    model_dir = tmp_path_factory.mktemp("estimator")
    estimator = make(model_dir)
    hook = ipu_session_run_hooks.IPULoggingTensorHook(every_n_iter=8, at_end=True)
    estimator._params["hooks"] = [hook]  # noqa: SLF001 - the model_fn's log hook
    estimator.train(input_fn, steps=16)
    estimator._params.pop("hooks")  # noqa: SLF001
    return estimator, hook


def test_train_matches_gradient_descent_and_checkpoints(trained):
    estimator, hook = trained
    w, b, losses = reference(16)
    assert estimator.get_variable_value("global_step") == 16
    np.testing.assert_allclose(estimator.get_variable_value("w"), w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(estimator.get_variable_value("b"), b, rtol=1e-5, atol=1e-6)
    assert sorted(estimator.get_variable_names()) == ["b", "global_step", "w"]
    # save_checkpoints_steps=8: after step 8, and at the end.
    assert checkpoints.all_checkpoints(estimator.model_dir) == [
        os.path.join(estimator.model_dir, f"model.ckpt-{s}") for s in (8, 16)]
    # The hook got the loss of the last step of the loop off the IPU.
    assert [step for step, _ in hook.logged] == [4, 12, 16]
    np.testing.assert_allclose([v["loss"] for _, v in hook.logged],
                               [losses[3], losses[11], losses[15]], rtol=1e-5)
    assert any(f.startswith("events.out.tfevents") for f in os.listdir(estimator.model_dir))


def test_evaluate_and_predict_use_the_checkpoint(trained):
    estimator, _ = trained
    w, b, _ = reference(16)
    results = estimator.evaluate(input_fn, steps=8)
    pred = X @ w + b
    assert results["global_step"] == 16
    np.testing.assert_allclose(results["mse"], np.mean((pred - Y) ** 2), rtol=1e-5)
    np.testing.assert_allclose(results["mae"], np.mean(np.abs(pred - Y)), rtol=1e-5)
    np.testing.assert_allclose(results["loss"], np.mean((pred - Y) ** 2), rtol=1e-5)
    # Metrics start again from zero at each evaluation.
    again = estimator.evaluate(input_fn, steps=4)
    np.testing.assert_allclose(again["mse"], np.mean((pred[:32] - Y[:32]) ** 2), rtol=1e-5)

    def features_only(params):
        return tf.data.Dataset.from_tensor_slices(X).batch(params["batch_size"], drop_remainder=True)

    outputs = list(estimator.predict(features_only))
    assert len(outputs) == 64 and set(outputs[0]) == {"y"}
    np.testing.assert_allclose(np.stack([o["y"] for o in outputs]), pred, rtol=1e-5, atol=1e-6)
    assert len(list(estimator.predict(features_only, num_predictions=5))) == 5
    batches = list(estimator.predict(features_only, yield_single_examples=False))
    assert len(batches) == 8 and batches[0]["y"].shape == (BATCH, 1)


def test_a_new_estimator_resumes_from_the_latest_checkpoint(trained, tmp_path):
    estimator, _ = trained
    estimator.train(input_fn, steps=8)  # steps add to the global step
    assert estimator.get_variable_value("global_step") == 24
    resumed = make(estimator.model_dir)
    resumed.train(input_fn, max_steps=32)
    w, _, _ = reference(32)
    np.testing.assert_allclose(resumed.get_variable_value("w"), w, rtol=1e-5, atol=1e-6)
    resumed.train(input_fn, max_steps=32)  # nothing left to do
    assert resumed.get_variable_value("global_step") == 32


def test_a_save_killed_half_way_leaves_the_last_checkpoint_whole(tmp_path, monkeypatch):
    estimator = make(tmp_path)
    estimator.train(input_fn, steps=8)
    real_replace = os.replace
    moved = []

    def dying_replace(src, dst):
        if moved:  # the data file is in place, the index not yet
            raise KeyboardInterrupt
        moved.append(dst)
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", dying_replace)
    with pytest.raises(KeyboardInterrupt):
        estimator.train(input_fn, steps=4)
    monkeypatch.undo()
    assert estimator.latest_checkpoint().endswith("model.ckpt-8")
    restarted = make(tmp_path)  # removes what the killed save left
    assert sorted(os.listdir(tmp_path)) == sorted(
        ["checkpoint", "model.ckpt-8.index", "model.ckpt-8.data-00000-of-00001"]
        + [f for f in os.listdir(tmp_path) if f.startswith("events")])
    restarted.train(input_fn, steps=4)
    w, _, _ = reference(12)
    np.testing.assert_allclose(restarted.get_variable_value("w"), w, rtol=1e-5, atol=1e-6)


_KILLED_RUN = textwrap.dedent("""
    import os, signal, sys
    sys.path.insert(0, {tests!r})
    import test_ipu_estimator as t

    class KillAfter:
        def begin(self): pass
        def before_run(self, context): return None
        def after_run(self, context, values):
            if context.global_step >= 12:
                os.kill(os.getpid(), signal.SIGKILL)
        def end(self, session): pass

    t.make(sys.argv[1]).train(t.input_fn, steps=40, hooks=[KillAfter()])
""")


def test_a_killed_training_run_resumes_at_its_last_checkpoint(tmp_path):
    script = _KILLED_RUN.format(tests=os.path.dirname(__file__))
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == -signal.SIGKILL, done.stderr[-3000:]
    # Killed at step 12: the checkpoint of step 8 is the latest, and whole.
    estimator = make(tmp_path)
    assert estimator.latest_checkpoint().endswith("model.ckpt-8")
    estimator.train(input_fn, max_steps=16)
    w, b, _ = reference(16)
    np.testing.assert_allclose(estimator.get_variable_value("w"), w, rtol=1e-5, atol=1e-6)


def test_graphcore_rules_and_messages(tmp_path):
    estimator = make(tmp_path)
    with pytest.raises(ValueError, match=r"steps \(6\) must be a multiple of iterations_per_loop \(4\)"):
        estimator.train(input_fn, steps=6)
    with pytest.raises(ValueError, match="Can not provide both steps and max_steps"):
        estimator.train(input_fn, steps=4, max_steps=8)

    def incrementing(features, labels, mode, params):
        w = tf.compat.v1.get_variable("w", shape=(4, 1))
        loss = tf.reduce_mean(tf.square(tf.matmul(features, w) - labels))
        step = tf.compat.v1.train.get_global_step()
        train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss, global_step=step)
        return ipu_estimator.IPUEstimatorSpec(mode, loss=loss, train_op=train_op)

    bad = ipu_estimator.IPUEstimator(incrementing, model_dir=str(tmp_path / "bad"),
                                     params={"batch_size": BATCH})
    with pytest.raises(ValueError, match="Illegal increment of the `global_step`"):
        bad.train(input_fn, steps=1)

    class Fetching:
        def begin(self): pass
        def before_run(self, context):
            return tf.compat.v1.train.SessionRunArgs({"x": tf.constant(1)})

    with pytest.raises(NotImplementedError, match="IPULoggingTensorHook"):
        estimator.train(input_fn, steps=4, hooks=[Fetching()])
    with pytest.raises(ValueError, match="An input_receiver_fn must be defined"):
        estimator.export_saved_model(str(tmp_path / "export"), None)
    with pytest.raises(ValueError, match="must be a positive integer"):
        ipu_run_config.IPURunConfig(iterations_per_loop=0)
    # Graphcore's IPURunConfig is a namedtuple of these fields.
    run = ipu_run_config.IPURunConfig(iterations_per_loop=4)
    assert run == (4, None, 1, 1, 0, None)
    assert run._replace(ordinal=1).ordinal == 1
    with pytest.raises(AttributeError):
        run.num_shards = 2
    with pytest.raises(ValueError, match="Must provide loss and train_op"):
        ipu_estimator.IPUEstimatorSpec(ModeKeys.TRAIN, loss=tf.constant(1.0))
