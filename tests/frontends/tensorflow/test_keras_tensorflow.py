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
         "keras_fit_evaluate_predict", "keras_gradient_accumulation", "keras_replication", "keras_pipelined_replicas"],
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


def test_gradient_accumulation(results):
    r = results["keras_gradient_accumulation"]
    assert r["weights_diff"] < 1e-5 and r["iterations"] == 4
    assert "must be a multiple of gradient_accumulation_steps_per_replica (2)" in r["error"]


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
