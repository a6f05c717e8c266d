"""One prediction of a placed pipelined program (issue 10, item 4): the
executable fit compiles for a two-stage model predicts its step under the
pipeline schedule, and predict_training (which traces the same program)
reads the same numbers: step cycles, samples/s, memory per IPU. Checked
against the schedules' formulas from the per-IPU cycles, and those against
the program's own step costs."""

import sys
from pathlib import Path

import keras
import numpy as np
import pytest

import keras_ipu as ipu
from keras_ipu.device.simulator import prediction as sim_prediction
from keras_ipu.device.simulator import sharding
from keras_ipu.device.simulator.memory_model import graph_of
from keras_ipu.models.prediction import predict_training

sys.path.insert(0, str(Path(__file__).parents[1] / "frontends" / "tensorflow"))
from keras_tf_scenarios import schedule_formula  # noqa: E402

G, MB = 4, 4


def _model(schedule):
    cfg = ipu.config.IPUConfig()
    cfg.auto_select_ipus = 2
    cfg.configure_ipu_system()
    keras.utils.set_random_seed(3)
    with ipu.ipu_strategy.IPUStrategy().scope():
        x = inputs = keras.Input((16,))
        with ipu.keras.PipelineStage(0):
            x = keras.layers.Dense(32, activation="tanh")(x)
        with ipu.keras.PipelineStage(1):
            x = keras.layers.Dense(8)(x)
        model = keras.Model(inputs, x)
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse", steps_per_execution=G)
        model.set_pipelining_options(
            gradient_accumulation_steps_per_replica=G,
            pipeline_schedule=getattr(ipu.pipelining_ops.PipelineSchedule, schedule))
    rng = np.random.default_rng(0)
    data = rng.normal(size=(32, 16)).astype("float32"), rng.normal(size=(32, 8)).astype("float32")
    return model, data


def _fit(schedule):
    model, data = _model(schedule)
    model.fit(*data, batch_size=MB, epochs=1, verbose=0, shuffle=False)
    (exe,) = model.train_function.device_loop.executables()
    return model, exe


@pytest.mark.parametrize("schedule", ["Grouped", "Interleaved", "Sequential"])
def test_the_executable_and_predict_training_give_one_number(schedule):
    model, exe = _fit(schedule)
    pred = exe.prediction
    pipe = pred.pipeline
    assert pipe is not None and pipe.schedule == schedule
    assert pipe.gradient_accumulation_count == G and pipe.steps_per_run == 1
    # The schedule's formula, not the micro-batches one after another.
    assert pipe.step_cycles == schedule_formula(pipe)
    assert pred.cycles == pipe.program_cycles == pipe.step_cycles
    assert pred.cycles_per_step == pipe.step_cycles
    assert pred.samples_per_second == pytest.approx(G * MB / pred.step_seconds)
    # Each IPU's forward and backward cycles are its nodes in the micro-batch
    # loop's body; its update the nodes around the loop in the step.
    # (The program as it runs: the loop bodies compiled, fused.)
    program = graph_of(exe)
    path = sharding.pipeline_path(program)
    holder, index = path[-1]
    body = sharding.step_program(program)[0]
    assert any(n.primitive.name == "fused_elementwise" for n in holder.nodes)
    body_steps = sim_prediction.step_costs(body, pred.target)
    holder_steps = sim_prediction.step_costs(holder, pred.target)
    for p in pipe.ipus:
        assert p.cycles == sum(s.cycles for s in body_steps if s.ipu == p.ipu)
        assert p.weight_update_cycles == sum(
            s.cycles for i, s in enumerate(holder_steps) if s.ipu == p.ipu and i != index)
    # The micro-batches in flight on the first stage under the schedule.
    assert [p.in_flight for p in pipe.ipus] == {
        "Grouped": [3, 1], "Interleaved": [2, 1], "Sequential": [1, 1]}[schedule]
    # predict_training traces the same program: the same numbers.
    training = predict_training(model, MB)
    assert training.sharded.schedule == schedule
    assert training.sharded.step_cycles == pipe.step_cycles
    assert training.samples_per_second == pytest.approx(pred.samples_per_second)
    for p, q in zip(training.sharded.ipus, pipe.ipus):
        assert (p.ipu, p.forward_cycles, p.backward_cycles, p.weight_update_cycles) == (
            q.ipu, q.forward_cycles, q.backward_cycles, q.weight_update_cycles)
        assert p.memory.tile_bytes == exe.memory_by_ipu[p.ipu].tile_bytes
        assert p.stash_bytes == q.stash_bytes


def test_grouped_overlaps_the_stages_where_the_old_sum_did_not():
    """Grouped overlaps the IPUs' micro-batches: fewer cycles than their work
    one after another (what the executable used to predict), and no more
    than Interleaved (whose forward and backward slots alternate)."""
    cycles = {}
    for schedule in ("Grouped", "Interleaved"):
        _, exe = _fit(schedule)
        pred = exe.prediction
        cycles[schedule] = pred.cycles_per_step
        summed = pred.compute_cycles + pred.exchange_cycles + pred.sync_cycles
    assert cycles["Grouped"] < summed
    assert cycles["Grouped"] <= cycles["Interleaved"]


@pytest.mark.parametrize("schedule", ["Grouped", "Sequential"])
def test_the_profile_draws_the_stages_overlapping(schedule):
    """The report and the trace of a pipelined fit: the schedule in the
    report's cycles, and in the Program steps lane one row per IPU with
    each micro-batch's forward and backward pass where the schedule puts
    them, within the run's device time."""
    from keras_ipu.device.simulator import profile
    from keras_ipu.report import timeline

    _, exe = _fit(schedule)
    pred = exe.prediction
    section = profile.build_report(exe)["cycles"]["pipeline"]
    assert section["schedule"] == schedule and section["step_cycles"] == pred.pipeline.step_cycles
    assert [x["ipu"] for x in section["ipus"]] == [0, 1]
    slices, counters = timeline.run_slices(exe, pred, "fit", 0.0)
    passes = [s for s in slices if s.lane == timeline.STEPS]
    device_start = timeline.transfer_seconds(pred)[0] * 1e6
    device_end = device_start + pred.device_seconds * 1e6
    assert all(device_start <= s.start_us and s.start_us + s.dur_us <= device_end + 1e-6
               for s in passes)
    forward = {(s.ipu, s.args["micro-batch"]): s for s in passes if s.args["pass"] == "forward"}
    assert sorted(forward) == [(ipu_, m) for ipu_ in (0, 1) for m in range(G)]
    # Micro-batch m reaches IPU 1 after it left IPU 0's forward pass.
    for m in range(G):
        first, second = forward[(0, m)], forward[(1, m)]
        assert second.start_us >= first.start_us + first.dur_us - 1e-6
    # Under Grouped the IPUs work at once on different micro-batches; under
    # Sequential never.
    def overlap(a, b):
        return min(a.start_us + a.dur_us, b.start_us + b.dur_us) - max(a.start_us, b.start_us)

    busy0 = [s for s in passes if s.ipu == 0]
    busy1 = [s for s in passes if s.ipu == 1]
    most = max(overlap(a, b) for a in busy0 for b in busy1)
    assert (most > 1e-6) == (schedule == "Grouped")
    assert {c.ipu for c in counters} == {0, 1}


def test_predict_training_of_a_model_with_two_inputs_and_two_outputs_before_any_fit():
    # The fit program's device loop takes the batch flat, and the compiled
    # loss makes one tracker per output on its first call: predicting before
    # fit (as benchmarks/bert_large_pipeline.py does) must see both.
    cfg = ipu.config.IPUConfig()
    cfg.auto_select_ipus = 2
    cfg.configure_ipu_system()
    with ipu.ipu_strategy.IPUStrategy().scope():
        a, b = keras.Input((8,)), keras.Input((4,))
        with ipu.keras.PipelineStage(0):
            h = keras.layers.Dense(16)(keras.layers.Concatenate()([a, b]))
        with ipu.keras.PipelineStage(1):
            outputs = [keras.layers.Dense(3)(h), keras.layers.Dense(2)(h)]
        model = keras.Model([a, b], outputs)
        model.compile(optimizer="sgd", loss=["mse", "mse"], steps_per_execution=G)
        model.set_pipelining_options(gradient_accumulation_steps_per_replica=G)
        before = predict_training(model, 2)
        x = [np.zeros((16, 8), "float32"), np.zeros((16, 4), "float32")]
        y = [np.zeros((16, 3), "float32"), np.zeros((16, 2), "float32")]
        model.fit(x, y, batch_size=2, epochs=1, verbose=0)
    (exe,) = model.train_function.device_loop.executables()
    assert before.sharded.step_cycles == exe.prediction.pipeline.step_cycles


@pytest.mark.parametrize("schedule", ["Grouped", "Interleaved", "Sequential"])
def test_evaluate_and_predict_programs_are_pipelined_inference(schedule):
    """Graphcore pipelines inference too: evaluate's and predict's programs
    run the execution's steps (G per replica) as micro-batches through the
    stages, forward passes only (no backward, nothing stashed, no weight
    update), with the schedule's ramp-up and ramp-down: the formula with
    B_k = 0, each IPU's forward cycles its nodes in the device loop's body."""
    model, (x, y) = _model(schedule)
    model.evaluate(x, y, batch_size=MB, verbose=0)
    model.predict(x, batch_size=MB, verbose=0)
    for function in (model.test_function, model.predict_function):
        (exe,) = function.device_loop.executables()
        pred = exe.prediction
        pipe = pred.pipeline
        assert pipe is not None and pipe.schedule == schedule and not pipe.training
        # 32 samples, batches of MB, G steps per execution: G micro-batches.
        assert pipe.gradient_accumulation_count == G and pipe.steps_per_run == 1
        body = sharding.step_program(graph_of(exe))[0]  # the bodies that run
        body_steps = sim_prediction.step_costs(body, pred.target)
        for p in pipe.ipus:
            assert p.backward_cycles == 0 and p.stash_bytes == 0 and p.in_flight == 1
            assert p.forward_cycles == sum(s.cycles for s in body_steps if s.ipu == p.ipu) > 0
        f = [p.forward_cycles for p in pipe.ipus]
        after = [p.weight_update_cycles for p in pipe.ipus]
        by_hand = {"Grouped": (G + 1) * max(f) + max(after),
                   "Interleaved": (G + 1) * max(f) + max(after),
                   "Sequential": G * sum(f) + sum(after)}[schedule]
        assert pipe.step_cycles == by_hand == schedule_formula(pipe)
        assert pred.cycles == pipe.program_cycles == pipe.step_cycles
