"""Graphcore's TF1 optimizer wrappers (issue 12, item 3) and the
cross-replica operators, in estimators and ipu_compiler programs."""

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

import keras_ipu as ipu  # noqa: E402
from keras_ipu import ipu_estimator  # noqa: E402
from keras_ipu import ipu_run_config  # noqa: E402
from keras_ipu.optimizers import v1 as ipu_optimizers  # noqa: E402

ModeKeys = ipu_estimator.ModeKeys
RNG = np.random.default_rng(1)
X = RNG.random((64, 4)).astype("float32")
Y = X @ np.array([[1.0], [-2.0], [3.0], [0.5]], "float32")
BATCH, LR = 8, 0.1


def input_fn(params):
    return tf.data.Dataset.from_tensor_slices((X, Y)).batch(
        params["batch_size"], drop_remainder=True).repeat()


def make_model_fn(wrap):
    def model_fn(features, labels, mode, params):
        w = tf.compat.v1.get_variable("w", shape=(4, 1), initializer=tf.compat.v1.zeros_initializer())
        loss = tf.reduce_mean(tf.square(tf.matmul(features, w) - labels))
        optimizer = wrap(tf.compat.v1.train.GradientDescentOptimizer(LR))
        return ipu_estimator.IPUEstimatorSpec(mode, loss=loss, train_op=optimizer.minimize(loss))
    return model_fn


def train(tmp_path, wrap, steps=8, replicas=1, ipl=4):
    options = ipu.config.IPUConfig()
    options.auto_select_ipus = replicas
    config = ipu_run_config.RunConfig(
        ipu_run_config=ipu_run_config.IPURunConfig(iterations_per_loop=ipl, num_replicas=replicas,
                                                   ipu_options=options),
        model_dir=str(tmp_path))
    estimator = ipu_estimator.IPUEstimator(make_model_fn(wrap), config=config,
                                           train_batch_size=BATCH * replicas)
    estimator.train(input_fn, steps=steps)
    return estimator.get_variable_value("w")


def grad(w, k, size=BATCH):
    x, y = X[k:k + size], Y[k:k + size]
    return (2.0 / size) * x.T @ (x @ w - y)


@pytest.mark.parametrize("method", ["SUM", "MEAN"])
def test_gradient_accumulation_applies_every_num_mini_batches(tmp_path, method):
    w = train(tmp_path, lambda opt: ipu_optimizers.GradientAccumulationOptimizerV2(
        opt, 2, reduction_method=method))
    expected = np.zeros((4, 1), np.float32)
    for step in range(0, 8, 2):
        g = grad(expected, (step * BATCH) % 64) + grad(expected, ((step + 1) * BATCH) % 64)
        expected = expected - LR * (g / 2 if method == "MEAN" else g)
    np.testing.assert_allclose(w, expected, rtol=1e-5, atol=1e-6)


def test_cross_replica_optimizer_averages_the_replicas_gradients(tmp_path):
    w = train(tmp_path, ipu_optimizers.CrossReplicaOptimizer, steps=4, replicas=2)
    expected = np.zeros((4, 1), np.float32)
    for step in range(4):
        # Replica r of step t reads batch 2t + r: the mean of the two
        # gradients is the gradient of the 16 examples.
        expected = expected - LR * grad(expected, (step * 2 * BATCH) % 64, 2 * BATCH)
    np.testing.assert_allclose(w, expected, rtol=1e-5, atol=1e-6)


def test_a_replicated_step_needs_a_cross_replica_optimizer(tmp_path):
    with pytest.raises(ValueError, match="CrossReplicaOptimizer"):
        train(tmp_path, lambda opt: opt, steps=4, replicas=2)


def test_map_gradient_optimizer_graphcore_example():
    values = [1.0, 2.0, 3.0]
    variables = [tf.Variable([v]) for v in values]

    def grads():
        a, b, c = variables
        optimizer = ipu_optimizers.MapGradientOptimizer(
            tf.compat.v1.train.GradientDescentOptimizer(1e-6), lambda g, v: g + 0.01 * v)
        pairs = optimizer.compute_gradients(a * b + a * c + b * c, var_list=variables)
        return [g for g, _ in pairs]

    result = ipu.ipu_compiler.compile(grads)
    np.testing.assert_allclose(np.concatenate([r.numpy() for r in result]), [5.01, 4.02, 3.03],
                               rtol=1e-6)


def test_wrappers_forward_and_check_their_arguments():
    sgd = tf.compat.v1.train.GradientDescentOptimizer(0.1)
    assert ipu_optimizers.IpuOptimizer(sgd).get_name() == sgd.get_name()
    assert ipu.optimizers.CrossReplicaOptimizer is ipu_optimizers.CrossReplicaOptimizer
    with pytest.raises(ValueError, match="only supports GradientDescentOptimizer"):
        ipu_optimizers.GradientAccumulationOptimizer(tf.compat.v1.train.AdamOptimizer(), 2)
    with pytest.raises(ValueError, match="num_mini_batches must be a positive number"):
        ipu_optimizers.GradientAccumulationOptimizerV2(sgd, 0)
    with pytest.raises(TypeError, match="tf.compat.v1.train.Optimizer"):
        ipu_optimizers.IpuOptimizer(object())
    x = tf.constant([1.0, 2.0])
    (same,) = ipu.ipu_compiler.compile(
        lambda: ipu.cross_replica_ops.cross_replica_mean(x) + ipu.cross_replica_ops.cross_replica_sum(x))
    np.testing.assert_allclose(same.numpy(), [2.0, 4.0])  # one replica: identities
