"""recomputation_mode of pipelined models: on with IPUConfig.allow_recompute
only, Auto resolved by the schedule, unsupported pairs refused with
Poplar's message, memory changed and values not."""

import keras
import numpy as np
import pytest

import keras_ipu as ipu
from keras_ipu.device.compiler import recompute
from keras_ipu.device.compiler.options import CONFIGURED
from keras_ipu.models.prediction import predict_training
from keras_ipu.models.recomputation import training_recomputation
from keras_ipu.ops.pipelining_ops import PipelineSchedule
from keras_ipu.ops.pipelining_ops import RecomputationMode


def _configure(allow_recompute):
    cfg = ipu.config.IPUConfig()
    cfg.auto_select_ipus = 2
    cfg.allow_recompute = allow_recompute
    cfg.configure_ipu_system()


def _pipelined_model(width=64, layers=3, seed=5):
    keras.utils.set_random_seed(seed)
    with ipu.ipu_strategy.IPUStrategy().scope():
        x = inputs = keras.Input((width,))
        for stage in (0, 1):
            with ipu.keras.PipelineStage(stage):
                for _ in range(layers):
                    x = keras.layers.Dense(width, activation="tanh")(x)
        model = keras.Model(inputs, x)
        model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse", steps_per_execution=8)
        model.set_pipelining_options(gradient_accumulation_steps_per_replica=4)
    return model


def test_the_mode_is_the_compilers():
    assert RecomputationMode is recompute.RecomputationMode
    assert [m.name for m in RecomputationMode] == [
        "Auto", "RecomputeThenBackpropagate", "RecomputeAndBackpropagateInterleaved"]


@pytest.mark.parametrize("schedule, expected", [
    (PipelineSchedule.Grouped, RecomputationMode.RecomputeThenBackpropagate),
    (PipelineSchedule.Interleaved, RecomputationMode.RecomputeThenBackpropagate),
    (PipelineSchedule.Sequential, RecomputationMode.RecomputeAndBackpropagateInterleaved),
])
def test_auto_is_resolved_by_the_schedule(schedule, expected):
    _configure(True)
    model = _pipelined_model()
    model.set_pipelining_options(gradient_accumulation_steps_per_replica=4,
                                 pipeline_schedule=schedule)
    assert training_recomputation(model) is expected


@pytest.mark.parametrize("schedule, mode, name", [
    (PipelineSchedule.Sequential, RecomputationMode.RecomputeThenBackpropagate,
     "Recompute_then_backpropagate"),
    (PipelineSchedule.Interleaved, RecomputationMode.RecomputeAndBackpropagateInterleaved,
     "Recompute_and_backpropagate_interleaved"),
])
def test_unsupported_pairs_are_refused_with_poplars_message(schedule, mode, name):
    _configure(True)
    model = _pipelined_model()
    model.set_pipelining_options(gradient_accumulation_steps_per_replica=4,
                                 pipeline_schedule=schedule, recomputation_mode=mode)
    with pytest.raises(NotImplementedError, match=(
            f"Pipeline schedule {schedule.name} does not support '{name}' "
            "recomputation mode.")):
        training_recomputation(model)


def test_off_without_allow_recompute_and_configured_when_not_pipelined():
    _configure(False)
    model = _pipelined_model()
    model.set_pipelining_options(
        gradient_accumulation_steps_per_replica=4,
        recomputation_mode=RecomputationMode.RecomputeAndBackpropagateInterleaved)
    assert training_recomputation(model) is None
    with ipu.ipu_strategy.IPUStrategy().scope():
        plain = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    assert training_recomputation(plain) == CONFIGURED


def _train(allow_recompute):
    _configure(allow_recompute)
    model = _pipelined_model()
    rng = np.random.default_rng(0)
    x = rng.normal(size=(8 * 16, 64)).astype("float32")
    y = rng.normal(size=(8 * 16, 64)).astype("float32")
    history = model.fit(x, y, batch_size=16, epochs=2, verbose=0, shuffle=False)
    return model, history.history["loss"]


def test_recomputation_changes_memory_never_values():
    kept, kept_loss = _train(False)
    recomputed, recomputed_loss = _train(True)
    np.testing.assert_array_equal(kept_loss, recomputed_loss)
    for a, b in zip(kept.get_weights(), recomputed.get_weights()):
        np.testing.assert_array_equal(a, b)
    # The first stage's stash (activations kept for its backward pass, one
    # copy per micro-batch in flight) goes: only its input is stored.
    _configure(False)
    stash_kept = predict_training(_pipelined_model(width=256), 256).sharded.ipus[0].stash_bytes
    _configure(True)
    stash_recomputed = predict_training(
        _pipelined_model(width=256), 256).sharded.ipus[0].stash_bytes
    assert stash_recomputed < stash_kept
