"""tf.keras (Keras 3 on TensorFlow) code through the TensorFlow front end.

The scenarios run in one subprocess under KERAS_BACKEND=tensorflow
(keras_tf_scenarios.py): this test session runs the ipu backend.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

SCRIPT = Path(__file__).parent / "keras_tf_scenarios.py"


@pytest.fixture(scope="module")
def results():
    env = dict(os.environ, KERAS_BACKEND="tensorflow", TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "conv_net_losses", "graphcore_custom_loop",
         "keras_fit_evaluate_predict", "keras_gradient_accumulation", "keras_replication", "keras_pipelined_replicas",
         "keras_pipeline_stage_placed", "keras_run_and_step_cycles"],
        env=env, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        pytest.fail(f"the TensorFlow scenarios failed:\n{proc.stderr[-6000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _rel(a, b):
    a, b = np.asarray(a), np.asarray(b)
    return float(np.max(np.abs(a - b) / np.abs(b)))


def test_conv_net_training_losses_match_tensorflow(results):
    """A conv net (Conv2D, BatchNormalization, MaxPooling, Dense, Adam)
    trained 20 steps: the bridged losses equal TensorFlow's within 1e-4,
    with dropout (TensorFlow's XLA random bits, bit for bit) and without
    (TensorFlow's own kernels, no XLA)."""
    curves = results["conv_net_losses"]
    assert len(curves["ipu"]) == 20
    assert _rel(curves["ipu_dropout"], curves["xla_dropout"]) < 1e-4
    assert _rel(curves["ipu"], curves["tf"]) < 1e-4
    assert curves["ipu"][-1] < curves["ipu"][0]


def test_graphcore_custom_training_loop(results):
    """Graphcore's TF2 custom loop (next(iterator), GradientTape, a tf.keras
    model, optimizer.apply_gradients, outfeed_queue.enqueue(loss)) run by
    IPUStrategy.run: one program compiled, run 3 times for 10 steps each;
    the losses equal TensorFlow's step by step."""
    r = results["graphcore_custom_loop"]
    assert len(r["losses"]) == 30 and r["iterations"] == 30 and r["programs"] == 1
    assert _rel(r["losses"], r["reference"]) < 1e-4
    _assert_profiled_as(r["input_bytes"], r["expected_bytes"])


def test_fit_evaluate_predict_in_ipu_strategy(results):
    """A tf.keras model made in an IPUStrategy scope trains through the
    front end with TensorFlow's numbers: 2 epochs of 8 batches with
    steps_per_execution=4 are 4 runs of one compiled program."""
    r = results["keras_fit_evaluate_predict"]
    assert r["on_ipu"]
    assert _rel(r["loss"], r["ref_loss"]) < 1e-5
    assert r["accuracy"] == r["ref_accuracy"]
    assert _rel(r["evaluate"], r["ref_evaluate"]) < 1e-5
    assert r["predict_shape"] == [44, 2] and r["predict_diff"] < 1e-5
    assert r["weights_diff"] < 1e-5 and r["iterations"] == 16
    assert r["train_programs"] == 4 and r["compiled"] == 1
    _assert_profiled_as(r["input_bytes"], r["expected_bytes"])


def _assert_profiled_as(found, expected):
    """The program's profile splits its variables as Keras does (weights,
    the optimizer's variables, the metrics'); what is left is the program's
    arguments (the step count), not a variable."""
    arguments = found.pop("program inputs", 0)
    assert found == expected and 0 < arguments <= 8


def test_gradient_accumulation(results):
    r = results["keras_gradient_accumulation"]
    assert r["weights_diff"] < 1e-5 and r["iterations"] == 4
    # Graphcore's check and message, as under the ipu backend.
    assert r["error"].startswith(
        "RuntimeError: The model has been configured to use gradient accumulation for "
        "training, however the current `steps_per_execution` value (set to 3) is not "
        "divisible by `gradient_accumulation_steps_per_replica` (2).")


def test_replication(results):
    """Two replicas: the mean of two batches' gradients per update, an
    execution takes 2 x steps_per_execution batches, predictions in
    batch order."""
    r = results["keras_replication"]
    assert r["replicas"] == 2 and r["iterations"] == 4 and r["train_programs"] == 2
    assert r["weights_diff"] < 1e-5 and r["predict_diff"] < 1e-5


def test_pipelined_model_replicas_span_its_stages(results):
    """Four IPUs, a two-stage pipeline: two replicas, as Graphcore's
    (the device's IPUs over the IPUs of one replica)."""
    r = results["keras_pipelined_replicas"]
    assert r == {"replicas": 2, "iterations": 2, "train_programs": 2}


def test_pipeline_stage_scopes_place_the_programs_as_the_ipu_backend_does(results):
    """A Functional model with PipelineStage(0) / PipelineStage(1) scopes
    under KERAS_BACKEND=tensorflow is pipelined: two replicas of two IPUs
    on a 4-IPU device (it was four replicas of one IPU when the scopes were
    not recorded), and its fit / evaluate / predict programs are placed as
    the ipu backend places the same model's: each Dense product on its
    stage's IPU, activations copied forward (and gradients back when
    training), cycles predicted per IPU."""
    import keras_ipu as ipu
    from keras_tf_scenarios import pipeline_stage_model
    from keras_tf_scenarios import placement_facts

    r = results["keras_pipeline_stage_placed"]
    # 16 batches, 2 replicas x 4 steps per execution, 4 micro-batches per
    # optimizer step: 2 executions of one step.
    assert r["replicas"] == 2 and r["iterations"] == 2
    assert np.isfinite(r["loss"]).all()
    model, (x, y) = pipeline_stage_model(ipu)
    model.fit(x, y, batch_size=2, epochs=1, verbose=0, shuffle=False)
    model.evaluate(x, y, batch_size=2, verbose=0)
    model.predict(x, batch_size=2, verbose=0)
    assert model._get_replication_factor() == r["replicas"]
    shapes = [list(w.shape) for w in model.trainable_weights if len(w.shape) == 2]
    for kind in ("train", "test", "predict"):
        (exe,) = getattr(model, f"{kind}_function").device_loop.executables()
        want = json.loads(json.dumps(placement_facts(exe, shapes)))
        assert r["facts"][kind] == want, kind
    assert r["facts"]["train"]["kernels"] == {"[16, 32]": [0], "[32, 8]": [1]}
    assert r["facts"]["train"]["copies"] == [[0, 1], [1, 0]]
    # Its training program's prediction is the pipeline's (Grouped, 4
    # micro-batches per step): the schedule's formula, not the micro-batches
    # one after another; the first stage holds 2 (n - 1) + 1 in flight.
    s = r["schedule"]
    assert (s["schedule"], s["micro_batches"], s["in_flight"]) == ("Grouped", 4, [3, 1])
    assert s["step_cycles"] == s["formula"] and s["cycles"] == s["program_cycles"]
    # Its evaluate and predict programs are pipelined inference, predicted
    # the same way: the execution's 4 steps per replica as micro-batches,
    # forward passes only, by hand (g + n - 1) x max_k F_k + the work after.
    for kind, p in r["inference"].items():
        assert (p["schedule"], p["micro_batches"], p["training"]) == ("Grouped", 4, False), kind
        assert p["in_flight"] == [1, 1] and p["backward"] == [0, 0] and min(p["forward"]) > 0
        assert p["step_cycles"] == (4 + 1) * max(p["forward"]) + max(p["after"]) == p["formula"]
        assert p["cycles"] == p["program_cycles"] == p["step_cycles"]


def test_training_program_prediction_counts_every_step_of_a_run(results):
    """steps_per_execution=4: the program's device loop (an XLA while) runs
    4 trips, read from the program (a Repeat of 4: the body 4 times, no
    condition), so a run costs 4 bodies (nothing else in the program costs
    cycles) and a step a quarter of the run, with the batch's samples. With
    accumulation over 2 the loop runs 2 weight updates, each a loop of 2
    micro-batches: 2 steps per run of 16 samples."""
    r = results["keras_run_and_step_cycles"]
    plain, accumulated = r["plain"], r["accumulated"]
    assert (plain["trips"], plain["inner_trips"]) == (4, [])
    assert plain["loop_cycles"] == 4 * plain["body_cycles"]
    assert plain["run_cycles"] == plain["loop_cycles"] + plain["other_cycles"]
    assert (plain["steps_per_run"], plain["batch_size"]) == (4, 8)
    assert plain["per_step"] == plain["run_cycles"] / 4
    assert f"{plain['run_cycles'] / 4:,.0f} cycles per step" in plain["summary"]
    assert (accumulated["trips"], accumulated["inner_trips"]) == (2, [2])
    assert accumulated["loop_cycles"] == 2 * accumulated["body_cycles"]
    assert (accumulated["steps_per_run"], accumulated["batch_size"]) == (2, 16)
    assert accumulated["per_step"] == accumulated["run_cycles"] / 2
