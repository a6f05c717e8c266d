"""Offloaded optimizer state (offload_weight_update_variables,
replicated_optimizer_state_sharding): what stays off the IPU, what moving
it costs per weight update, and Graphcore's defaults and errors, checked
against hand computations on a two-stage model."""

import math

import keras
import pytest

import keras_ipu as ipu
from keras_ipu.device.liveness import walk
from keras_ipu.device.simulator import cost_model
from keras_ipu.device.trace import trace_flat
from keras_ipu.device.ir import ShapedArray
from keras_ipu.models import offload
from keras_ipu.models.prediction import predict_training

BATCH = 4
# Dense(8 -> 16) on IPU 0, Dense(16 -> 4) on IPU 1; Adam: two float32 slots
# per variable. Slots of at least 128 bytes (minimum_remote_tensor_size)
# move: kernel 8x16 (512 B) on IPU 0; kernel 16x4 (256 B) on IPU 1; the
# biases (64 B, 16 B) and the step counter stay.
OFFLOADED_0 = 2 * 8 * 16 * 4
OFFLOADED_1 = 2 * 16 * 4 * 4


def configure(replicas=1, version="ipu2", remote_buffers=False, ipus_per_replica=2):
    cfg = ipu.config.IPUConfig()
    cfg.ipu_model.version = version
    cfg.device_connection.version = version
    cfg.auto_select_ipus = ipus_per_replica * replicas
    cfg.device_connection.enable_remote_buffers = remote_buffers
    cfg.configure_ipu_system()


def two_stage(**pipelining):
    keras.utils.set_random_seed(0)
    strategy = ipu.ipu_strategy.IPUStrategy()
    with strategy.scope():
        inputs = keras.Input((8,))
        with ipu.keras.PipelineStage(0):
            x = keras.layers.Dense(16, activation="relu")(inputs)
        with ipu.keras.PipelineStage(1):
            x = keras.layers.Dense(4)(x)
        model = keras.Model(inputs, x)
        model.compile(keras.optimizers.Adam(0.01), "mse")
        model.set_pipelining_options(gradient_accumulation_steps_per_replica=4, **pipelining)
    return model


def accumulating(**optimizer_kwargs):
    """Dense(8 -> 16) on one IPU, Adam, accumulating 2 micro-batches."""
    strategy = ipu.ipu_strategy.IPUStrategy()
    with strategy.scope():
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16)])
        model.compile(keras.optimizers.Adam(), "mse")
        model.set_gradient_accumulation_options(
            gradient_accumulation_steps_per_replica=2,
            **optimizer_kwargs)
    return model


def test_offloaded_slots_leave_the_ipu_and_cost_a_load_and_store_per_update():
    configure()
    on = predict_training(two_stage(offload_weight_update_variables=True), BATCH)
    off = predict_training(two_stage(offload_weight_update_variables=False), BATCH)
    for ipu_, moved in ((0, OFFLOADED_0), (1, OFFLOADED_1)):
        p_on, p_off = on.sharded.ipus[ipu_], off.sharded.ipus[ipu_]
        assert p_on.memory.streamed_bytes == moved and p_off.memory.streamed_bytes == 0
        assert p_off.memory.input_bytes - p_on.memory.input_bytes == moved
        target = on.sharded.target
        # Loaded and stored once per weight update over Streaming Memory,
        # taken at the host link's one-way rate (64 GB/s both ways: 32 GB/s).
        expected = math.ceil(2 * moved / 32e9 * target.clock_hz)
        assert p_on.offload_cycles == expected
        assert p_on.weight_update_cycles - p_off.weight_update_cycles == expected
        assert p_off.offload_cycles == 0
    assert "offloaded" in str(on) and "offloaded" not in str(off)


def test_replicated_sharding_splits_the_state_and_adds_an_all_gather():
    configure(replicas=2)
    model = two_stage(offload_weight_update_variables=True,
                      replicated_optimizer_state_sharding=True)
    pred = predict_training(model, BATCH)
    target = pred.sharded.target
    # Sharded over 2 replicas the threshold doubles (256 B): the 16x4
    # kernel's slots (256 B each) still move, each replica storing half.
    for ipu_, moved in ((0, OFFLOADED_0), (1, OFFLOADED_1)):
        stream = math.ceil(2 * (moved // 2) / 32e9 * target.clock_hz)
        link_bytes = math.ceil(moved / 2)  # (k - 1) / k of the whole, k = 2
        gather = (math.ceil(link_bytes / target.ipu_link_bytes_per_s * target.clock_hz)
                  + cost_model.INTER_IPU_SYNC_CYCLES)
        assert pred.sharded.ipus[ipu_].offload_cycles == stream + gather


def test_shard_bytes_pad_to_a_multiple_of_the_replicas():
    assert cost_model.replica_shard_bytes(10 * 4, 4, 4) == 3 * 4
    assert cost_model.replica_shard_bytes(12 * 2, 2, 4) == 3 * 2
    assert cost_model.all_gather_link_traffic(1000, 4) == (750, 3)
    assert cost_model.all_gather_link_traffic(1000, 1) == (0, 0)


def test_graphcore_defaults_and_errors():
    # None: offloaded where the system has remote buffers (ipu2 machines do).
    configure()
    default = predict_training(two_stage(), BATCH)
    assert default.sharded.ipus[0].memory.streamed_bytes == OFFLOADED_0
    # ipu1 (C2 cards) has none: None keeps the state, True is Poplar's error.
    configure(version="ipu1", ipus_per_replica=1)
    assert predict_training(accumulating(), BATCH).sharded.ipus[0].memory.streamed_bytes == 0
    with pytest.raises(offload.FailedPreconditionError, match="does not support remote memory"):
        predict_training(accumulating(offload_weight_update_variables=True), BATCH)
    # ... unless the config says the target has remote buffers.
    configure(version="ipu1", remote_buffers=True, ipus_per_replica=1)
    forced = predict_training(accumulating(offload_weight_update_variables=True), BATCH)
    assert forced.sharded.ipus[0].memory.streamed_bytes == OFFLOADED_0
    configure(replicas=2)
    with pytest.raises(NotImplementedError, match="without offloading"):
        predict_training(two_stage(offload_weight_update_variables=False,
                                   replicated_optimizer_state_sharding=True), BATCH)


def test_nothing_is_offloaded_without_a_separate_weight_update():
    configure(ipus_per_replica=1)
    assert offload.offloaded_variables(accumulating(), 1, 1) == ([], 1)
    model = accumulating(offload_weight_update_variables=True)
    model.optimizer.build(model.trainable_variables)
    chosen, shards = offload.offloaded_variables(model, 1, 2)
    assert shards == 1 and sorted(tuple(v.shape) for v in chosen) == [(8, 16), (8, 16)]


def test_a_streamed_input_is_live_from_its_load_to_its_store():
    """m (streamed) is on the IPU from its first reader on, its new value
    m2 until its last reader (then stored back), not to the end."""
    def step(w, m, x):
        y = x * 3.0                    # step 0
        m2 = m * 0.5 + y               # steps 1, 2: m loaded at step 1
        return [(w - m2) * 2.0, m2]    # steps 3 (m2's last reader), 4

    aval = ShapedArray((1024,), "float32")
    graph, _ = trace_flat(step, [aval, aval, aval])
    assert len(graph.nodes) == 5
    k = 1024 * 4

    def live_bytes(streamed):
        return [s.totals[0] for s in walk(graph, lambda v: (v.aval.nbytes,),
                                          streamed=streamed)]

    # Live at each step (its results and what it reads last included):
    # plain: y; y, m/2; y, m/2, m2; m2, d; m2 (an output, to the end), d, out.
    assert live_bytes(None) == [k, 2 * k, 3 * k, 2 * k, 3 * k]
    # streamed: m joins at step 1, m2 leaves after step 3.
    assert live_bytes(({graph.inputs[1]}, {graph.outputs[1]})) == [k, 3 * k, 3 * k, 2 * k, 2 * k]


def test_the_fit_executable_offloads_as_predict_training_does():
    """The program fit compiles knows its offloaded state (its placement's
    Pipelining): its memory per IPU and its weight update cycles are
    predict_training's offload columns."""
    import numpy as np

    configure()
    model = two_stage(offload_weight_update_variables=True)
    model.compile(keras.optimizers.Adam(0.01), "mse", steps_per_execution=4)
    rng = np.random.default_rng(0)
    model.fit(rng.normal(size=(16, 8)).astype("float32"),
              rng.normal(size=(16, 4)).astype("float32"),
              batch_size=BATCH, epochs=1, verbose=0)
    (exe,) = model.train_function.device_loop.executables()
    training = predict_training(model, BATCH)
    for ipu_, moved in ((0, OFFLOADED_0), (1, OFFLOADED_1)):
        assert exe.memory_by_ipu[ipu_].streamed_bytes == moved
        assert exe.memory_by_ipu[ipu_].total_bytes == training.sharded.ipus[ipu_].memory.total_bytes
        mine = exe.prediction.pipeline.ipus[ipu_]
        assert mine.offload_cycles == training.sharded.ipus[ipu_].offload_cycles > 0
        assert mine.weight_update_cycles == training.sharded.ipus[ipu_].weight_update_cycles
