"""The example scripts (examples/*.py) run as a user runs them
(`python examples/NAME.py`, their own settings) and print what they
promise: losses that fall, accuracies, and the simulator's predictions
(cycles, memory per IPU). Each is a few seconds of CPU (most of it the
imports). tensorflow_on_ipu.py and popdist_training.py have their own
tests (tests/frontends/tensorflow/test_example.py,
tests/distributed/test_multiprocess.py); synthetic_mnist.py is the
others' data."""

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np

EXAMPLES = Path(__file__).parents[2] / "examples"


def run_example(name, backend="ipu", **env_vars):
    env = dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="3", **env_vars)
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / name)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stdout


def test_predict_on_ipu_classifies_the_stripes():
    out = run_example("predict_on_ipu.py")
    assert "backend: ipu" in out
    assert "predict accuracy: 1.000" in out
    loss, accuracy = re.search(
        r"evaluate: loss=([\d.]+) accuracy=([\d.]+)", out
    ).groups()
    assert float(accuracy) == 1.0
    assert 0.0 < float(loss) < 0.5


def test_train_on_ipu_learns_the_stripes():
    out = run_example("train_on_ipu.py")
    assert "backend: ipu" in out
    first, last = map(
        float, re.search(r"training loss: ([\d.]+) -> ([\d.]+)", out).groups()
    )
    assert last < first / 10, out[-2000:]
    accuracy = float(re.search(r"test: loss=[\d.e-]+ accuracy=([\d.]+)", out).group(1))
    assert accuracy >= 0.95, out[-2000:]


def test_train_on_ipu_without_the_profile_extra(tmp_path):
    # The README's first command installs no [profile] extra: the example
    # must still finish, with the report's summary and no pictures.
    blocker = tmp_path / "matplotlib"
    blocker.mkdir()
    (blocker / "__init__.py").write_text("raise ImportError('no matplotlib here')\n")
    out = run_example(
        "train_on_ipu.py",
        PYTHONPATH=os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])),
    )
    assert "Predicted for a real IPU" in out
    assert "pictures need matplotlib" in out
    assert "Wrote" not in out


# -- what the simulator predicts (models/prediction.py's report) -------------

_HEADER = re.compile(
    r"Training (\S+) on (\w+): (\d+) IPU\(s\) per replica x (\d+) replica\(s\), "
    r"micro-batch (\d+), gradient accumulation (\d+)(?:, schedule (\w+))?")
_BYTES = r"[\d.]+ (?:[KMG]i)?B"
_ROW = re.compile(
    r"^ +(\d+) ([\d,]+) +([\d,]+) +(\(with fwd\)|[\d,]+) +([\d,]+) +" + _BYTES
    + r" +(\d+) +([\d.]+) ((?:[KMG]i)?B) +" + _BYTES, re.M)
_TOTAL = re.compile(
    r"(\d+) inter-IPU copies \(.*?\), ([\d,]+) cycles per weight update, "
    r"utilisation (\d+)%, ([\d.]+) ms per step, ([\d,.]+) samples/s")
_UNITS = {"B": 1, "KiB": 2 ** 10, "MiB": 2 ** 20, "GiB": 2 ** 30}


def _number(text):
    return int(text.replace(",", ""))


def predictions(out):
    """Each training prediction the script printed: its header's fields,
    one row per IPU (cycles, memory in bytes) and the step's totals."""
    found = []
    for block in re.split(r"(?=^Training \S+ on )", out, flags=re.M)[1:]:
        header = _HEADER.match(block)
        assert header, block[:300]
        total = _TOTAL.search(block)
        assert total, block[:1000]
        rows = [
            {"ipu": int(r[0]), "forward": _number(r[2]),
             "backward": 0 if r[3] == "(with fwd)" else _number(r[3]),
             "update": _number(r[4]), "in_flight": int(r[5]),
             "memory": float(r[6]) * _UNITS[r[7]]}
            for r in _ROW.findall(block[:total.start()])
        ]
        found.append({
            "model": header[1], "ipus_per_replica": int(header[3]),
            "replicas": int(header[4]), "micro_batch": int(header[5]),
            "accumulation": int(header[6]), "schedule": header[7], "rows": rows,
            "cycles": _number(total[2]), "samples_per_second": float(total[5].replace(",", "")),
        })
    return found


def check_prediction(pred, ipus, replicas, micro_batch, accumulation):
    assert (pred["ipus_per_replica"], pred["replicas"], pred["micro_batch"],
            pred["accumulation"]) == (ipus, replicas, micro_batch, accumulation), pred
    assert [r["ipu"] for r in pred["rows"]] == list(range(ipus)), pred
    assert all(r["forward"] > 0 and r["memory"] > 0 for r in pred["rows"]), pred
    assert pred["cycles"] > 0 and pred["samples_per_second"] > 0, pred


def losses(out, label):
    first, last = map(float, re.search(re.escape(label) + r" ([\d.]+) -> ([\d.]+)", out).groups())
    return first, last


def check_learns(out, loss_label, accuracy_label):
    """The training loss falls by more than 4x, and the test accuracy (on
    the synthetic classes, learnable in a few steps: synthetic_mnist.py) is
    high."""
    first, last = losses(out, loss_label)
    assert last < first / 4, out
    accuracy = float(re.search(re.escape(accuracy_label) + r" ([\d.]+)", out).group(1))
    assert accuracy >= 0.9, out


# A model that has learnt anything beats guessing among 10 classes.
CHANCE_LOSS = float(np.log(10))


def test_ipu_strategy_fit_and_strategy_run():
    out = run_example("ipu_strategy.py")
    assert "fit: test accuracy 1.000" in out, out
    (pred,) = predictions(out)
    check_prediction(pred, ipus=1, replicas=1, micro_batch=32, accumulation=1)
    # strategy.run's custom step continues from the fitted weights.
    first, last = losses(out, "strategy.run: loss")
    assert first < CHANCE_LOSS and last < CHANCE_LOSS, out
    assert re.search(r"strategy.run inference: 3[0-2]/32 right", out), out


def test_replicated_training_on_four_replicas():
    out = run_example("replicated_training.py")
    assert "replication factor: 4" in out
    check_learns(out, "training loss:", "test accuracy (mean of the replicas):")
    (pred,) = predictions(out)
    check_prediction(pred, ipus=1, replicas=4, micro_batch=16, accumulation=1)


def test_model_parallel_training_example():
    out = run_example("model_parallel_training.py")
    assert "replicas: 2 of 2 IPUs each" in out
    first, last = losses(out, "training loss:")
    assert last < first / 4
    # 8 steps per run, one all-reduce of a replica's [16, 10] float32 logits each.
    assert "per run 8 all-reduce (5,120 B)" in out
    assert "sequential/dense_1/kernel: 802,816 B, 401,408 B on each IPU" in out


def test_gradient_accumulation_equals_the_big_batch():
    out = run_example("gradient_accumulation.py")
    loss = float(re.search(r"4 x 16, MEAN: loss ([\d.]+)", out).group(1))
    assert loss < CHANCE_LOSS, out
    # MEAN over 4 micro-batches of 16 is one batch of 64 up to float32
    # rounding (the weights are of order 0.1-1; float32's epsilon 1.2e-7).
    difference = float(re.search(r"largest weight difference from batch 64: ([\d.e+-]+)", out).group(1))
    assert difference < 1e-5, out
    (pred,) = predictions(out)
    check_prediction(pred, ipus=1, replicas=1, micro_batch=16, accumulation=4)
    # The weight update is paid once per 4 micro-batches.
    (row,) = pred["rows"]
    assert row["update"] > 0
    assert pred["cycles"] == 4 * (row["forward"] + row["backward"]) + row["update"], pred


def test_pipeline_sequential_on_two_ipus():
    out = run_example("pipeline_sequential.py")
    check_learns(out, "training loss:", "test accuracy:")
    (pred,) = predictions(out)
    check_prediction(pred, ipus=2, replicas=1, micro_batch=16, accumulation=8)
    assert pred["schedule"] == "Interleaved"


def test_pipelined_functional_predicts_each_schedule():
    out = run_example("pipelined_functional.py")
    # The stage assignment summary: each layer and its pipeline stage.
    stages = dict(re.findall(r"^(\w+) \(\w+\) \(0\) .*? (\d) +$", out, re.M))
    assert stages == {"conv2d": "0", "max_pooling2d": "0", "flatten": "1",
                      "dense": "1", "dense_1": "1"}, out
    check_learns(out, "training loss:", "test accuracy:")
    preds = predictions(out)
    assert [p["schedule"] for p in preds] == ["Grouped", "Interleaved", "Sequential"], out
    for pred in preds:
        check_prediction(pred, ipus=2, replicas=1, micro_batch=16, accumulation=8)
    # Same stages, so the same work per micro-batch; what the schedule
    # changes is how many activations stage 0 holds (its memory) and the
    # step's cycles.
    work = {(r["forward"], r["backward"], r["update"]) for p in preds for r in p["rows"][:1]}
    assert len(work) == 1, preds
    in_flight = [p["rows"][0]["in_flight"] for p in preds]
    memory = [p["rows"][0]["memory"] for p in preds]
    assert in_flight[2] == 1 and min(in_flight[:2]) > 1, preds
    assert memory[2] < min(memory[:2]), preds


def test_auto_pipeline_plans_a_split_that_fits():
    out = run_example("auto_pipeline.py")
    plans = re.split(r"(?=^Pipeline plan for )", out, flags=re.M)[1:]
    assert len(plans) == 2, out
    one, four = plans
    assert "1 stages on 1 ipu2 IPUs, micro-batch 8192" in one and "does NOT fit" in one, one
    assert "OUT OF MEMORY" in one
    assert "4 stages on 4 ipu2 IPUs, micro-batch 8192" in four, four
    # Most splits overflow an IPU (Grouped stashes the first stages'
    # activations); the plan is the fastest of those that fit.
    assert re.search(r"^  fits; utilisation \d+%", four, re.M), four
    assert "of the splits predicted did not fit" in four, four
    rows = re.findall(r"^ +(\d) +([\d,]+) +([\d.]+) [KMG]iB +([\d.]+) KiB +(.*)$", four, re.M)
    assert [r[0] for r in rows] == ["0", "1", "2", "3"], four
    assert not any("OUT OF MEMORY" in r[4] for r in rows), four
    # Every layer is in one stage, in order: flatten and 7 Dense.
    assert rows[0][4].startswith("flatten (0)"), four
    counts = [int(m[1]) if (m := re.search(r"\((\d+) in all\)", r[4]))
              else len(re.findall(r"\w+ \(0\)", r[4])) for r in rows]
    assert sum(counts) == 8 and min(counts) >= 1, four
    first, last = losses(out, "trained the planned pipeline: loss")
    assert last < first, out
