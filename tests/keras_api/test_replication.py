"""Replication: each replica takes its own batches (batch t * replicas + r),
the gradients are all-reduced (mean), BatchNormalization statistics,
metrics and random seeds stay per replica; the IPU's rules for the data."""

import logging

import keras
import numpy as np
import pytest

import keras_ipu as ipu
from keras_ipu.device.primitives import REGISTRY
from keras_ipu.device.simulator import replicas as sim_replicas

from ipu_keras_helpers import configure
from ipu_keras_helpers import max_weight_difference
from ipu_keras_helpers import mlp
from ipu_keras_helpers import regression_data


def compile_sgd(model, steps_per_execution, metrics=None):
    model.compile(keras.optimizers.SGD(0.05), "mse", metrics=metrics,
                  steps_per_execution=steps_per_execution)


def test_two_replicas_of_batch_b_train_as_one_of_batch_2b():
    x, y = regression_data()
    strategy = ipu.ipu_strategy.IPUStrategy()
    one = mlp(strategy)
    with strategy.scope():
        compile_sgd(one, 2)
        one.fit(x, y, batch_size=8, epochs=2, verbose=0, shuffle=False)
    configure(2)
    two = mlp(strategy)
    with strategy.scope():
        compile_sgd(two, 2)
        two.fit(x, y, batch_size=4, epochs=2, verbose=0, shuffle=False)
    assert two._get_replication_factor() == 2
    assert max_weight_difference(one, two) < 1e-6


def test_batch_normalization_keeps_per_replica_statistics():
    configure(2)
    x, y = regression_data(n=8)
    strategy = ipu.ipu_strategy.IPUStrategy()
    model = mlp(strategy, batch_norm=True)
    dense, bn = model.layers[1], model.layers[2]
    kernel, bias = dense.kernel.numpy(), dense.bias.numpy()
    with strategy.scope():
        compile_sgd(model, 1)
        model.fit(x, y, batch_size=4, epochs=1, verbose=0, shuffle=False)
    # Replica 0 (whose values the host shows) saw batch 0 only.
    batch0 = np.maximum(x[:4] @ kernel + bias, 0)
    np.testing.assert_allclose(bn.moving_mean.numpy(), 0.01 * batch0.mean(axis=0), rtol=1e-5, atol=1e-8)
    replica1 = model.train_function.execution.states._copies[0]
    batch1 = np.maximum(x[4:] @ kernel + bias, 0)
    means = [np.asarray(v) for v in replica1 if np.shape(v) == (16,)]
    assert any(np.allclose(m, 0.01 * batch1.mean(axis=0), rtol=1e-5, atol=1e-8) for m in means)


def test_distributed_batch_norm_shares_the_statistics_of_a_replica_group():
    cfg = ipu.config.IPUConfig()
    cfg.auto_select_ipus = 2
    cfg.norms.experimental.distributed_batch_norm_replica_group_size = 2
    cfg.configure_ipu_system()
    x, y = regression_data(n=8)
    strategy = ipu.ipu_strategy.IPUStrategy()
    model = mlp(strategy, batch_norm=True)
    dense, bn = model.layers[1], model.layers[2]
    kernel, bias = dense.kernel.numpy(), dense.bias.numpy()
    with strategy.scope():
        compile_sgd(model, 1)
        model.fit(x, y, batch_size=4, epochs=1, verbose=0, shuffle=False)
    both = np.maximum(x @ kernel + bias, 0)  # batch 0 (replica 0) and 1
    np.testing.assert_allclose(bn.moving_mean.numpy(), 0.01 * both.mean(axis=0),
                               rtol=1e-5, atol=1e-8)
    replica1 = model.train_function.execution.states._copies[0]
    means = [np.asarray(v) for v in replica1 if np.shape(v) == (16,)]
    assert any(np.allclose(m, bn.moving_mean.numpy(), rtol=1e-6) for m in means)


@pytest.mark.parametrize("method", ["NONE", "SUM", "MEAN", "LIST"])
def test_metrics_of_the_replicas_are_reduced_as_asked(method):
    configure(2)
    x, y = regression_data(n=16)
    strategy = ipu.ipu_strategy.IPUStrategy()
    model = mlp(strategy)
    with strategy.scope():
        model.set_replication_options(method)
        compile_sgd(model, 1)
        logs = model.evaluate(x, y, batch_size=4, verbose=0, return_dict=True)
    # Per replica: mse over its own batches (2 and 0, 3 and 1).
    pred = model.predict(x, batch_size=4, verbose=0)
    per_batch = ((pred - y) ** 2).reshape(4, 4).mean(axis=1)
    replica = [per_batch[[0, 2]].mean(), per_batch[[1, 3]].mean()]
    want = {"NONE": replica[1], "SUM": sum(replica), "MEAN": np.mean(replica),
            "LIST": np.array(replica)}[method]
    np.testing.assert_allclose(logs["loss"], want, rtol=1e-5)


def test_predict_returns_the_batches_in_order():
    configure(4)
    x, _ = regression_data(n=32)
    strategy = ipu.ipu_strategy.IPUStrategy()
    model = mlp(strategy)
    with strategy.scope():
        compile_sgd(model, 2)
        out = model.predict(x, batch_size=4, verbose=0)
    np.testing.assert_allclose(out, np.asarray(model(x)), rtol=1e-5, atol=1e-6)


def test_replicas_draw_different_random_numbers():
    configure(2)
    x, y = regression_data(n=16)
    strategy = ipu.ipu_strategy.IPUStrategy()
    keras.utils.set_random_seed(0)
    with strategy.scope():
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dropout(0.5, seed=1),
                                  keras.layers.Dense(1)])
        compile_sgd(model, 2)
        model.fit(x, y, batch_size=4, epochs=1, verbose=0)
    seed = model.layers[0].seed_generator.state
    other = model.train_function.execution.states._copies[0]
    seeds = [np.asarray(v) for v in other if np.asarray(v).dtype == np.uint32]
    assert seeds and not np.array_equal(seeds[0], np.asarray(seed))
    assert seeds[0][1] == np.asarray(seed)[1]  # same number of draws


def test_host_writes_reach_every_replica():
    from keras_ipu.backend.trainer_ops import model_state

    configure(2)
    x, y = regression_data(n=16)
    strategy = ipu.ipu_strategy.IPUStrategy()
    model = mlp(strategy)
    with strategy.scope():
        compile_sgd(model, 2)
        model.fit(x, y, batch_size=4, epochs=1, verbose=0)
    model.set_weights([np.full_like(w, 0.5) for w in model.get_weights()])
    variables = model_state.state_variables(model, model_state.TRAIN_STATE)
    states = model.train_function.execution.states.read(variables, donate=False)
    for mine, theirs in zip(states[0][0], states[1][0]):  # trainable weights
        np.testing.assert_array_equal(np.asarray(theirs), 0.5)
        np.testing.assert_array_equal(np.asarray(mine), np.asarray(theirs))


def test_data_rules_of_the_ipu(caplog):
    configure(2)
    x, y = regression_data(n=40)
    strategy = ipu.ipu_strategy.IPUStrategy()
    model = mlp(strategy)
    with strategy.scope():
        compile_sgd(model, 3)
        with pytest.raises(ValueError, match=r"`steps_per_execution` \(3\) must be a "
                           r"divisor of the number of batches \(5\) in the dataset "
                           "provided to this replica"):
            model.fit(x, y, batch_size=4, verbose=0)
        with pytest.raises(ValueError, match="has a partial batch"):
            model.fit(x[:38], y[:38], batch_size=4, verbose=0)
        compile_sgd(model, 1)
        with caplog.at_level(logging.WARNING, logger="keras_ipu"):
            history = model.fit(x[:36], y[:36], batch_size=4, verbose=0)
        assert "The remaining 1 batch will be dropped" in caplog.text
        assert len(history.history["loss"]) == 1
        compile_sgd(model, 100)
        with caplog.at_level(logging.WARNING, logger="keras_ipu"):
            model.evaluate(x, y, batch_size=4, verbose=0)
        assert "only contains 5 batches. Using 5 as `steps_per_execution`" in caplog.text


def test_eager_is_refused_as_graphcore_does():
    strategy = ipu.ipu_strategy.IPUStrategy()
    model = mlp(strategy)
    x, y = regression_data(n=8)
    with strategy.scope():
        model.compile("sgd", "mse", run_eagerly=True)
        with pytest.raises(RuntimeError, match="Keras models cannot run eagerly when using `IPUStrategy`"):
            model.fit(x, y, batch_size=4, verbose=0)


def test_all_reduce_gradient_is_the_gradient_of_the_total_objective():
    # Replica r's loss L_r = sum((sum_k x_k)^2): d(sum_r L_r)/dx_0 = 2 R y.
    prim = REGISTRY["cross_replica_sum"]
    values = [np.array([1.0, 2.0], np.float32), np.array([0.5, -1.0], np.float32)]

    def replica(x):
        def loss(v):
            y = prim.bind(v, replicas=2, group_size=2)
            return keras.ops.sum(y * y)

        return np.asarray(ipu.device.autodiff.grad(loss)(keras.ops.convert_to_tensor(x)))

    got = sim_replicas.run_replicated(replica, [(v,) for v in values])
    total = values[0] + values[1]
    for g in got:
        np.testing.assert_allclose(g, 2 * 2 * total, rtol=1e-6)
