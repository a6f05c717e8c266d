"""The examples of the Keras API run and print what they promise (each a
subprocess, as a user runs it)."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).parents[2] / "examples"


def run_example(name):
    env = dict(os.environ, KERAS_BACKEND="ipu", TF_CPP_MIN_LOG_LEVEL="3")
    proc = subprocess.run([sys.executable, str(EXAMPLES / name)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stdout


def losses(out):
    first, last = re.search(r"loss:? ([\d.]+) -> ([\d.]+)", out).groups()
    return float(first), float(last)


def test_ipu_strategy_example():
    out = run_example("ipu_strategy.py")
    assert "fit: test accuracy 1.000" in out
    assert re.search(r"strategy.run inference: 3[0-2]/32 right", out)
    assert "Training sequential on ipu2: 1 IPU(s) per replica x 1 replica(s)" in out


def test_replicated_training_example():
    out = run_example("replicated_training.py")
    assert "replication factor: 4" in out
    first, last = losses(out)
    assert last < first / 4
    assert "1 IPU(s) per replica x 4 replica(s)" in out


def test_model_parallel_training_example():
    out = run_example("model_parallel_training.py")
    assert "replicas: 2 of 2 IPUs each" in out
    first, last = losses(out)
    assert last < first / 4
    # 8 steps per run, one all-reduce of a replica's [16, 10] float32 logits each.
    assert "per run 8 all-reduce (5,120 B)" in out
    assert "sequential/dense_1/kernel: 802,816 B, 401,408 B on each IPU" in out


@pytest.mark.parametrize("name, schedules", [
    ("pipelined_functional.py", ["Grouped", "Interleaved", "Sequential"]),
    ("pipeline_sequential.py", ["Interleaved"]),
])
def test_pipeline_examples(name, schedules):
    out = run_example(name)
    first, last = losses(out)
    assert last < first / 4
    assert float(re.search(r"test accuracy: ([\d.]+)", out).group(1)) > 0.9
    for schedule in schedules:
        assert f"2 IPU(s) per replica x 1 replica(s), micro-batch 16, gradient accumulation 8, " \
               f"schedule {schedule}" in out


def test_gradient_accumulation_example():
    out = run_example("gradient_accumulation.py")
    difference = float(re.search(r"largest weight difference from batch 64: ([\d.e+-]+)", out).group(1))
    assert difference < 1e-5
    assert "micro-batch 16, gradient accumulation 4" in out


def test_auto_pipeline_example():
    out = run_example("auto_pipeline.py")
    assert "does NOT fit" in out and "4 stages on 4 ipu2 IPUs" in out
    # Most splits overflow an IPU (Grouped stashes the first stages'
    # activations); the plan is the fastest of those that fit.
    assert "of the splits predicted did not fit" in out and "fits; utilisation" in out
    assert "trained the planned pipeline" in out
