"""What the simulator predicts for training a pipelined / replicated model:
per-IPU memory, copies between stages, the all-reduce, the schedule's
time, out-of-memory naming the IPU and its stages."""

import keras
import numpy as np
import pytest

import keras_ipu as ipu
from keras_ipu.device.simulator import cost_model
from keras_ipu.device.simulator import memory_model
from keras_ipu.models.prediction import predict_training
from keras_ipu.ops.pipelining_ops import PipelineSchedule

from ipu_keras_helpers import configure

BATCH, WIDTH = 32, 512


def wide_mlp(strategy, stages=(0, 1, 1), width=WIDTH, first=None):
    keras.utils.set_random_seed(0)
    with strategy.scope():
        inputs = keras.Input((128,))
        with ipu.keras.PipelineStage(stages[0]):
            x = keras.layers.Dense(first or width, activation="relu")(inputs)
        with ipu.keras.PipelineStage(stages[1]):
            x = keras.layers.Dense(width, activation="relu")(x)
        with ipu.keras.PipelineStage(stages[2]):
            x = keras.layers.Dense(10)(x)
        model = keras.Model(inputs, x)
        model.compile(keras.optimizers.SGD(0.1), "mse")
        model.set_pipelining_options(gradient_accumulation_steps_per_replica=16)
    return model


def test_pipeline_prediction_splits_memory_and_copies_activations():
    configure(2)
    strategy = ipu.ipu_strategy.IPUStrategy()
    model = wide_mlp(strategy)
    pred = predict_training(model, BATCH)
    assert pred.replicas == 1 and [p.ipu for p in pred.sharded.ipus] == [0, 1]
    activation = BATCH * WIDTH * 4
    big = [c for c in pred.sharded.copies if c.nbytes > 4]
    assert sorted((c.src, c.dst, c.nbytes) for c in big) == [(0, 1, activation), (1, 0, activation)]
    one_ipu = predict_training(model, BATCH, assignment=[0, 0, 0])
    assert one_ipu.sharded.n_stages == 1
    # The second and third layers' weights live on IPU 1 only.
    weights_1 = (WIDTH * WIDTH + WIDTH + WIDTH * 10 + 10) * 4
    assert pred.sharded.ipus[1].memory.input_bytes >= weights_1
    assert pred.sharded.ipus[0].memory.input_bytes < one_ipu.sharded.ipus[0].memory.input_bytes
    # Samples per second of the system: micro-batches x batch / step time.
    assert pred.samples_per_second == pytest.approx(BATCH * 16 / pred.step_seconds)


def test_schedules_change_time_and_stash_not_values():
    configure(2)
    strategy = ipu.ipu_strategy.IPUStrategy()
    model = wide_mlp(strategy)
    preds = {s: predict_training(model, BATCH, schedule=s) for s in PipelineSchedule}
    grouped, interleaved, sequential = (preds[s].sharded for s in PipelineSchedule)
    # Micro-batches in flight on the first stage of two: Grouped 3, Interleaved 2, Sequential 1.
    assert [p.ipus[0].in_flight for p in (grouped, interleaved, sequential)] == [3, 2, 1]
    # Grouped: (g + n - 1) x the slowest IPU's micro-batch, + the weight update.
    g, n = 16, 2
    slowest = max(p.cycles for p in grouped.ipus)
    update = max(p.weight_update_cycles for p in grouped.ipus)
    assert grouped.step_cycles == (g + n - 1) * slowest + update
    assert sequential.step_cycles == g * sum(p.cycles for p in sequential.ipus) + sum(
        p.weight_update_cycles for p in sequential.ipus)
    assert grouped.step_cycles < sequential.step_cycles


def test_replicas_pay_the_all_reduce_once_per_step():
    strategy = ipu.ipu_strategy.IPUStrategy()
    configure(1)
    one = predict_training(wide_mlp(strategy, stages=(0, 0, 0)), BATCH, assignment=[0, 0, 0])
    configure(4)
    four = predict_training(wide_mlp(strategy, stages=(0, 0, 0)), BATCH, assignment=[0, 0, 0])
    assert (one.replicas, four.replicas) == (1, 4)
    target = four.sharded.target
    # One ring all-reduce per weight tensor: its links and syncs, by hand.
    weights = [(128, WIDTH), (WIDTH,), (WIDTH, WIDTH), (WIDTH,), (WIDTH, 10), (10,)]
    link = sync = 0
    for shape in weights:
        nbytes = int(np.prod(shape)) * 4
        link_bytes, steps = cost_model.all_reduce_link_traffic(nbytes, 4)
        c, s = cost_model.collective_link_cycles(link_bytes, steps, target)
        link, sync = link + c, sync + s + cost_model.SYNC_CYCLES
    extra = four.sharded.ipus[0].weight_update_cycles - one.sharded.ipus[0].weight_update_cycles
    assert extra >= link + sync
    assert four.samples_per_second > 3 * one.samples_per_second


def test_out_of_memory_names_the_ipu_and_its_stages():
    configure(2)
    strategy = ipu.ipu_strategy.IPUStrategy()
    # Traced, never run: a batch of 65536 costs no host memory. Stage 1's
    # activations (65536 x 4096 floats, 1 GiB) overflow IPU 1.
    model = wide_mlp(strategy, width=4096, first=16)
    pred = predict_training(model, 65536)
    assert pred.sharded.ipus[0].memory.fits
    assert not pred.fits
    with pytest.raises(memory_model.IPUOutOfMemoryError, match=r"Pipeline stage\(s\) 1 of "
                       r"functional.*: Out of memory on IPU 1") as info:
        pred.check_memory()
    assert info.value.stages == (1,)
