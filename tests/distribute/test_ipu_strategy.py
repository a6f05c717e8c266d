"""IPUStrategy: scope, run (one compiled program, replicated over the
device's IPUs), reduce, datasets, the cross-replica collective."""

import threading
import warnings

import keras
import numpy as np
import pytest
from keras import ops

import keras_ipu as ipu
from keras_ipu.device.ir import ShapedArray
from keras_ipu.device.primitives import REGISTRY
from keras_ipu.device.simulator import cost_model
from keras_ipu.device.simulator import replicas as sim_replicas
from keras_ipu.device.config import system_config
from keras_ipu.device.simulator import targets
from keras_ipu.device.simulator.prediction import predict_costs

from ipu_keras_helpers import configure


def test_public_paths_are_graphcores():
    assert ipu.ipu_strategy.IPUStrategy is ipu.ipu_strategy.IPUStrategyV1
    strategy = ipu.ipu_strategy.IPUStrategy()
    assert strategy.num_replicas_in_sync == 1  # replication is inside the program
    assert strategy.extended.non_slot_devices(None) == "/device:IPU:0"


def test_scope_nests_the_same_strategy_and_refuses_another():
    a, b = ipu.ipu_strategy.IPUStrategy(), ipu.ipu_strategy.IPUStrategy()
    with a.scope():
        with a.scope():
            assert ipu.distribute.get_strategy() is a
        with pytest.raises(ValueError, match="Mixing different tf.distribute.Strategy"):
            with b.scope():
                pass
    assert ipu.distribute.get_strategy() is None


def test_run_compiles_once_and_writes_assigned_variables_back():
    strategy = ipu.ipu_strategy.IPUStrategy()
    with strategy.scope():
        model = keras.Sequential(
            [keras.Input((4,)), keras.layers.Dense(3), keras.layers.BatchNormalization()]
        )
    bn = model.layers[1]
    x = np.random.default_rng(0).normal(size=(8, 4)).astype("float32")

    def forward(x):
        return model(x, training=True)

    expected_mean = 0.99 * bn.moving_mean.numpy() + 0.01 * np.mean(
        x @ model.layers[0].kernel.numpy() + model.layers[0].bias.numpy(), axis=0
    )
    y = strategy.run(forward, args=(x,))
    assert y.shape == (8, 3)
    np.testing.assert_allclose(np.mean(y, axis=0), 0.0, atol=1e-5)
    np.testing.assert_allclose(bn.moving_mean.numpy(), expected_mean, rtol=1e-5, atol=1e-7)
    program = next(iter(strategy._runs[forward]._programs.values()))
    strategy.run(forward, args=(x + 1,))
    assert program._jitted.trace_count == 1  # same signature: same program


def test_run_a_jax_style_train_step_matches_eager():
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(4, activation="relu"),
                              keras.layers.Dense(1)])
    optimizer = keras.optimizers.SGD(0.1, momentum=0.9)
    optimizer.build(model.trainable_variables)
    rng = np.random.default_rng(2)
    x = rng.normal(size=(16, 5)).astype("float32")
    y = rng.normal(size=(16, 1)).astype("float32")

    def loss_fn(trainable, non_trainable, x, y):
        pred, non_trainable = model.stateless_call(trainable, non_trainable, x)
        return ops.mean((pred - y) ** 2), non_trainable

    def train_step(state, x, y):
        trainable, non_trainable, opt_vars = state
        (loss, non_trainable), grads = ipu.device.autodiff.value_and_grad(
            loss_fn, has_aux=True)(trainable, non_trainable, x, y)
        trainable, opt_vars = optimizer.stateless_apply(opt_vars, grads, trainable)
        return loss, (trainable, non_trainable, opt_vars)

    state = ([v.value for v in model.trainable_variables],
             [v.value for v in model.non_trainable_variables],
             [v.value for v in optimizer.variables])
    eager_state = state
    strategy = ipu.ipu_strategy.IPUStrategy()
    for _ in range(3):
        loss, state = strategy.run(train_step, args=(state, x, y))
        eager_loss, eager_state = train_step(eager_state, x, y)
        np.testing.assert_allclose(loss, eager_loss, rtol=1e-5)
    for a, b in zip(state[0], eager_state[0]):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_replicas_get_their_own_values_and_all_reduce():
    configure(4)
    strategy = ipu.ipu_strategy.IPUStrategy()
    values = strategy.experimental_distribute_values_from_function(
        lambda ctx: np.full((3,), ctx.replica_id_in_sync_group + 1, np.float32))
    assert isinstance(values, ipu.distribute.PerReplica) and len(values) == 4

    def f(v):
        return (ipu.distribute.cross_replica_sum(v),
                ipu.distribute.cross_replica_mean(v, replica_group_size=2),
                strategy.reduce("MEAN", v, axis=0),
                v)

    total, pair_mean, mean, own = strategy.run(f, args=(values,))
    np.testing.assert_array_equal(total, np.full(3, 10.0))  # 1 + 2 + 3 + 4
    np.testing.assert_array_equal(pair_mean, np.full(3, 1.5))  # replicas 0, 1
    np.testing.assert_array_equal(mean, 2.5)
    np.testing.assert_array_equal(own, np.full(3, 1.0))  # replica 0's result
    with pytest.raises(ValueError, match="replica_group_size=3 must divide the 4 replicas"):
        strategy.run(lambda v: ipu.distribute.cross_replica_sum(v, 3), args=(values,))


def test_reduce_on_the_host_reduces_only_the_axis():
    strategy = ipu.ipu_strategy.IPUStrategy()
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(strategy.reduce("SUM", x), x)
    np.testing.assert_array_equal(strategy.reduce(ipu.distribute.ReduceOp.MEAN, x, axis=0),
                                  [1.5, 2.5, 3.5])
    with pytest.raises(ValueError, match="Unsupported reduce op: MAX"):
        strategy.reduce("MAX", x)


def test_float64_inputs_are_refused_as_graphcore_does():
    strategy = ipu.ipu_strategy.IPUStrategy()
    with pytest.raises(TypeError, match="Unsupported data type for input: float64"):
        strategy.run(lambda x: x, args=(np.zeros(2),))


def test_experimental_run_v2_is_run_with_a_deprecation_warning():
    strategy = ipu.ipu_strategy.IPUStrategy()
    with pytest.warns(DeprecationWarning, match="Use `run` instead"):
        out = strategy.experimental_run_v2(lambda x: ops.add(x, 1.0), args=(np.ones(2, np.float32),))
    np.testing.assert_array_equal(out, [2.0, 2.0])


def test_distributed_dataset_gives_each_replica_its_element():
    configure(2)
    strategy = ipu.ipu_strategy.IPUStrategy()
    data = [(np.full((2,), i, np.float32), np.int32(i)) for i in range(5)]
    elements = list(strategy.experimental_distribute_dataset(data))
    assert len(elements) == 2  # 5 elements: two pairs, the last one dropped
    x, y = elements[1]
    assert [v[0] for v in x.values] == [2.0, 3.0] and list(y.values) == [2, 3]
    out = strategy.run(lambda x, y: ipu.distribute.cross_replica_sum(x), args=elements[1])
    np.testing.assert_array_equal(out, [5.0, 5.0])
    system_config.reset_ipu_configuration()
    single = list(ipu.ipu_strategy.IPUStrategy().experimental_distribute_dataset(data))
    assert len(single) == 5 and not isinstance(single[0][0], ipu.distribute.PerReplica)


def test_all_reduce_cost_is_the_ring_over_the_ipu_links():
    # 2 (k - 1) / k of the bytes over the links, 2 (k - 1) synchronised steps.
    assert cost_model.all_reduce_link_traffic(4000, 4) == (6000, 6)
    assert cost_model.all_reduce_link_traffic(4000, 1) == (0, 0)
    target = targets.get_target("ipu2")
    x = ShapedArray((1000,), "float32")
    rule = REGISTRY["cross_replica_sum"].cost
    cost = rule((x,), (x,), replicas=4, group_size=4)
    assert cost.kind == "collective" and (cost.link_bytes, cost.link_steps) == (6000, 6)
    assert cost.flops == 750  # (k - 1) / k of the elements added
    links, syncs = cost_model.collective_link_cycles(6000, 6, target)
    assert links == int(np.ceil(6000 / target.ipu_link_bytes_per_s * target.clock_hz))
    assert syncs == 6 * cost_model.INTER_IPU_SYNC_CYCLES

    jitted = ipu.device.jit.jit(
        lambda v: REGISTRY["cross_replica_sum"].bind(v, replicas=4, group_size=4))
    exe = jitted.executable(np.zeros(1000, np.float32))
    step = predict_costs(exe, target=target, log=False).steps[0]
    assert step.exchange == links and step.sync == syncs + cost_model.SYNC_CYCLES


def test_a_collective_outside_a_replicated_run_says_how_to_run_it():
    prim = REGISTRY["cross_replica_sum"]
    np.testing.assert_array_equal(prim.bind(np.ones(2, np.float32), replicas=1, group_size=1), 1.0)
    with pytest.raises(RuntimeError, match="compiled for 2 replicas but runs outside"):
        prim.bind(np.ones(2, np.float32), replicas=2, group_size=2)


def test_a_failing_replica_stops_the_group_instead_of_hanging():
    def replica(index):
        here = sim_replicas.current()
        if index == 1:
            raise ValueError("replica one fails")
        return here[0].all_reduce(here[1], np.ones(1), "sum", 3)

    with pytest.raises(ValueError, match="replica one fails") as info:
        sim_replicas.run_replicated(replica, [(0,), (1,), (2,)])
    assert "(raised by replica 1 of 3)" in "".join(getattr(info.value, "__notes__", []))
    # The replicas' own threads, by name: the process's thread count also
    # holds the host pool's workers that earlier tests in this worker
    # started (16 of them after a test capped at 16 threads).
    for thread in threading.enumerate():
        if thread.name.startswith("ipu-replica-"):
            thread.join(timeout=10)
    assert not [t.name for t in threading.enumerate()
                if t.name.startswith("ipu-replica-") and t.is_alive()]
