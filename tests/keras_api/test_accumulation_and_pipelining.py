"""Gradient accumulation and pipelining numerics: one weight update per
`gradient_accumulation_steps_per_replica` micro-batches, combined by the
reduction method; a pipelined model trains exactly as the same model with
gradient accumulation; schedules and recomputation modes change nothing."""

import keras
import numpy as np
import pytest

import keras_ipu as ipu
from keras_ipu.device.config import system_config
from keras_ipu.ops.pipelining_ops import PipelineSchedule
from keras_ipu.ops.pipelining_ops import RecomputationMode

from ipu_keras_helpers import configure
from ipu_keras_helpers import max_weight_difference
from ipu_keras_helpers import mlp
from ipu_keras_helpers import regression_data

LR = 0.05


def train(model, x, y, batch_size, steps_per_execution, epochs=1, lr=LR):
    model.compile(keras.optimizers.SGD(lr), "mse", steps_per_execution=steps_per_execution)
    return model.fit(x, y, batch_size=batch_size, epochs=epochs, verbose=0, shuffle=False)


@pytest.mark.parametrize("method, lr_scale", [("mean", 1.0), ("running_mean", 1.0), ("sum", 4.0)])
def test_accumulation_equals_one_big_batch(method, lr_scale):
    # 4 micro-batches of 4: MEAN (and RUNNING_MEAN) is the gradient of the
    # batch of 16; SUM is 4 times it.
    x, y = regression_data()
    strategy = ipu.ipu_strategy.IPUStrategy()
    accumulated = mlp(strategy)
    with strategy.scope():
        accumulated.set_gradient_accumulation_options(
            gradient_accumulation_steps_per_replica=4,
            gradient_accumulation_reduction_method=method)
        train(accumulated, x, y, batch_size=4, steps_per_execution=8, epochs=2)
    big = mlp(strategy)
    with strategy.scope():
        train(big, x, y, batch_size=16, steps_per_execution=2, epochs=2, lr=LR * lr_scale)
    assert max_weight_difference(accumulated, big) < 1e-5  # float32 rounding


def test_accumulation_keeps_the_weights_fixed_within_a_step():
    # One step of 4 micro-batches: the same update as the mean gradient of
    # the 4 computed at the initial weights (by hand, with autodiff).
    x, y = regression_data(n=16)
    strategy = ipu.ipu_strategy.IPUStrategy()
    model = mlp(strategy)
    weights = [np.array(w) for w in model.get_weights()]
    grads = []
    for k in range(4):
        xs, ys = x[4 * k:4 * k + 4], y[4 * k:4 * k + 4]

        def loss(ws):
            pred, _ = model.stateless_call(ws, [], xs)
            return keras.ops.mean((pred - ys) ** 2)

        grads.append(ipu.device.autodiff.grad(loss)([keras.ops.convert_to_tensor(w) for w in weights]))
    expected = [w - LR * np.mean([np.asarray(g[i]) for g in grads], axis=0)
                for i, w in enumerate(weights)]
    with strategy.scope():
        model.set_gradient_accumulation_options(
            gradient_accumulation_steps_per_replica=4, gradient_accumulation_reduction_method="MEAN")
        train(model, x, y, batch_size=4, steps_per_execution=4)
    for got, want in zip(model.get_weights(), expected):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_pipelined_model_trains_as_gradient_accumulation():
    configure(2)
    x, y = regression_data()
    strategy = ipu.ipu_strategy.IPUStrategy()
    pipelined = mlp(strategy, stages=[0, 0, 1], batch_norm=True)
    with strategy.scope():
        pipelined.set_pipelining_options(gradient_accumulation_steps_per_replica=4)
        train(pipelined, x, y, batch_size=4, steps_per_execution=8, epochs=2)
    accumulated = mlp(strategy, batch_norm=True)
    with strategy.scope():
        accumulated.set_gradient_accumulation_options(gradient_accumulation_steps_per_replica=4)
        train(accumulated, x, y, batch_size=4, steps_per_execution=8, epochs=2)
    assert pipelined._get_replication_factor() == 1 and accumulated._get_replication_factor() == 2
    # 2 replicas of batch 4 vs 1 pipeline of batch 4: compare on one replica.
    system_config.reset_ipu_configuration()
    accumulated_one = mlp(strategy, batch_norm=True)
    with strategy.scope():
        accumulated_one.set_gradient_accumulation_options(gradient_accumulation_steps_per_replica=4)
        train(accumulated_one, x, y, batch_size=4, steps_per_execution=8, epochs=2)
    assert max_weight_difference(pipelined, accumulated_one) < 1e-6


@pytest.mark.parametrize("options", [
    {"pipeline_schedule": PipelineSchedule.Interleaved},
    {"pipeline_schedule": PipelineSchedule.Sequential,
     "recomputation_mode": RecomputationMode.RecomputeAndBackpropagateInterleaved},
    {"recomputation_mode": RecomputationMode.RecomputeThenBackpropagate},
])
def test_schedules_and_recomputation_change_no_value(options):
    configure(2)
    x, y = regression_data(n=32)
    strategy = ipu.ipu_strategy.IPUStrategy()
    models = []
    for kwargs in ({}, options):
        model = mlp(strategy, stages=[0, 0, 1])
        with strategy.scope():
            model.set_pipelining_options(gradient_accumulation_steps_per_replica=4, **kwargs)
            train(model, x, y, batch_size=4, steps_per_execution=8)
        models.append(model)
    assert max_weight_difference(*models) == 0.0

