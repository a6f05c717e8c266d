"""Smoke test of benchmarks/fit_throughput.py: it runs end to end and writes
the JSON report with its fields. Speed is never asserted here (a unit test
on a shared machine cannot say anything reliable about it)."""

import importlib.util
import json
import os
import platform
import subprocess
import sys
import types
from pathlib import Path
from unittest import mock

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "fit_throughput.py"


def _load_script():
    spec = importlib.util.spec_from_file_location("fit_throughput", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_quick_ipu_run_writes_report(tmp_path):
    out = tmp_path / "report.json"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--backends", "ipu",
         "--models", "mlp", "--out", str(out)],
        capture_output=True, text=True, timeout=600,
        env={**os.environ, "KERAS_BACKEND": "ipu"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())

    config = report["config"]
    assert config["models"] == ["mlp"]
    assert config["backends"] == ["ipu"]
    assert config["batch_size"] == 128
    assert config["dtype"] == "float32"
    assert config["quick"] is True
    assert config["threads"] == 1
    assert config["thread_environment"]["OPENBLAS_NUM_THREADS"] == "1"
    assert config["weights_built_by"] == "ipu"

    ipu = report["results"]["ipu"]
    assert ipu["affinity"] == config["cpu_affinity"]
    # A quick run never gets hot: `auto` stays on NumPy, and nothing seeds
    # TensorFlow.
    assert ipu["tensorflow_loaded"] is False
    assert config["rounds"] == 1 and config["round_orders"] == [["ipu"]]
    assert config["keras_seed"] is False
    mlp = ipu["models"]["mlp"]
    assert "error" not in mlp, mlp
    for field in ("samples_per_s", "samples_per_s_min", "samples_per_s_max",
                  "first_epoch_s", "loss_after_first_epoch",
                  "initial_weights_abs_sum", "cpu_ms_per_step"):
        assert isinstance(mlp[field], float), (field, mlp[field])
        assert mlp[field] > 0, (field, mlp[field])
    assert mlp["samples_per_s_min"] <= mlp["samples_per_s"] <= mlp["samples_per_s_max"]
    assert len(mlp["timed_epoch_s"]) == 2  # --quick: 2 timed epochs
    assert mlp["jit_compile"] is True  # fit ran compiled, not op by op
    # 16-8-8-3 MLP: (16*8+8) + (8*8+8) + (8*3+3)
    assert mlp["parameters"] == 235

    # No other backend ran, so there is nothing to divide by.
    # The run loop's launches per timed step (threads 1: nothing launched).
    assert mlp["concurrency_per_step"] == {
        "launched": 0.0, "on_c_pool": 0.0, "c_pool_run_by_caller": 0.0,
        "ran_in_caller": 0.0, "late": 0.0}
    # Each epoch's engine (never hot: auto stays on NumPy, nothing
    # prepared).
    assert [e["epoch"] for e in mlp["epochs"]] == [0, 1, 2]
    assert [e["engine"] for e in mlp["epochs"]] == ["numpy"] * 3
    assert [e["s"] for e in mlp["epochs"][1:]] == [round(t, 3) for t in mlp["timed_epoch_s"]]
    assert mlp["tiering"] == []
    assert report["ratios"] == {"mlp": {}}
    assert "| mlp | ipu |" in report["table"]
    assert report["table"] in proc.stdout


def test_timed_epochs_go_on_until_the_least_timed_window(tmp_path):
    out = tmp_path / "report.json"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--backends", "ipu",
         "--models", "mlp", "--timed-epochs", "1", "--min-timed-seconds", "0.3",
         "--out", str(out)],
        capture_output=True, text=True, timeout=600,
        env={**os.environ, "KERAS_BACKEND": "ipu"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["config"]["min_timed_seconds"] == 0.3
    mlp = report["results"]["ipu"]["models"]["mlp"]
    timed = mlp["timed_epoch_s"]
    epochs = [e["epoch"] for e in mlp["epochs"]]
    assert epochs == list(range(len(timed) + 1))
    # The window runs from the first epoch's end to the last one's (seconds
    # since fit began, rounded to 1 ms): long enough at the last epoch
    # (unless the epochs ran out), and not yet at the one before it.
    ended = [e["ended_s"] for e in mlp["epochs"]]
    bench = _load_script()
    if len(timed) < bench.MAX_TIMED_EPOCHS:
        assert ended[-1] - ended[0] >= 0.3 - 0.002, ended
    assert ended[-2] - ended[0] < 0.3 + 0.002, ended


def test_missing_backend_is_reported_and_skipped(monkeypatch, tmp_path, capsys):
    bench = _load_script()
    monkeypatch.setitem(bench.BACKEND_MODULE, "jax", "no_such_module_h16")
    out = tmp_path / "report.json"
    bench.main(["--quick", "--backends", "jax", "--models", "mlp",
                "--out", str(out)])
    err = capsys.readouterr().err
    assert "backend jax: not installed" in err
    assert "no_such_module_h16" in err
    report = json.loads(out.read_text())
    assert "not installed" in report["results"]["jax"]["skipped"]
    assert "| mlp | jax | skipped: not installed" in report["table"]
    assert report["config"]["weights_built_by"] is None


def test_ratios_divide_ipu_by_the_reference():
    bench = _load_script()
    results = {
        "ipu": {"models": {"mlp": {"samples_per_s": 300.0, "first_epoch_s": 2.0}}},
        "tensorflow": {"models": {"mlp": {"samples_per_s": 100.0,
                                          "first_epoch_s": 4.0}}},
        "jax": {"skipped": "not installed"},
    }
    assert bench.ratios(results, ["mlp"]) == {
        "mlp": {"ipu/tensorflow": {"samples_per_s": 3.0, "first_epoch_s": 0.5}}
    }
    # With two peers, each ipu variant is also divided by the faster one.
    results["jax"] = {"models": {"mlp": {"samples_per_s": 150.0, "first_epoch_s": 1.0}}}
    results["ipu-xla"] = {"models": {"mlp": {"samples_per_s": 450.0, "first_epoch_s": 8.0}}}
    got = bench.ratios(results, ["mlp"])["mlp"]
    assert got["ipu/best"] == {"samples_per_s": 2.0, "first_epoch_s": 2.0, "best": "jax"}
    assert got["ipu-xla/best"]["samples_per_s"] == 3.0
    assert got["ipu-xla/tensorflow"]["first_epoch_s"] == 2.0


def test_gflops_and_peak_in_the_table():
    bench = _load_script()
    report = {
        "config": {"models": ["mlp"], "backends": ["ipu", "jax"], "batch_size": 100,
                   "blas_peak_gflops": 50.0},
        "results": {
            "ipu": {"models": {"mlp": {
                "samples_per_s": 1000.0, "samples_per_s_min": 900.0,
                "samples_per_s_max": 1100.0, "first_epoch_s": 1.0,
                "loss_after_first_epoch": 2.0, "train_step_flops": 2e9,
                "cpu_ms_per_step": 12.34}}},
            "jax": {"skipped": "not installed"},
        },
        "ratios": {"mlp": {}},
    }
    # 2 GFLOP per step of 100 samples at 1000 samples/s: 20 GFLOP/s, 40%;
    # 10 steps/s of 12.34 CPU ms: 0.12 cores busy.
    assert "| mlp | ipu | 1000 | 900...1100 | 20.0 | 40% | 12.3 | 0.12 | 1.00 | 2.0000 |" in (
        bench.format_table(report))


def test_default_threads_sets_nothing_and_pins_nothing(monkeypatch):
    """`--threads default` is what a user who sets no variable gets: the
    workers inherit none of the thread variables (even from the driver's
    shell) and run on every core the driver may use."""
    bench = _load_script()
    assert bench.parse_args(["--threads", "default"]).threads == bench.DEFAULT_THREADS
    variables = set(bench.thread_environment(1))
    assert {"OPENBLAS_NUM_THREADS", "XLA_FLAGS", "KERAS_IPU_HOST_THREADS"} <= variables
    for name in variables:
        monkeypatch.setenv(name, "3")
    env = bench.worker_environment(bench.DEFAULT_THREADS, {"KERAS_IPU_ENGINE": "numpy"})
    assert not variables & set(env)
    assert env["KERAS_IPU_ENGINE"] == "numpy"
    assert bench.benchmark_cores(bench.DEFAULT_THREADS) == sorted(os.sched_getaffinity(0))
    # A number sets every library's threads (over the shell's) and pins
    # that many cores.
    env = bench.worker_environment(1)
    assert env["OPENBLAS_NUM_THREADS"] == env["KERAS_IPU_HOST_THREADS"] == "1"
    assert bench.benchmark_cores(1) == sorted(os.sched_getaffinity(0))[:1]


def test_threads_must_be_a_count_or_default(capsys):
    bench = _load_script()
    for bad in ("0", "-2", "all", "1.5"):
        try:
            bench.parse_args(["--threads", bad])
        except SystemExit as stop:
            assert stop.code == 2
        else:
            raise AssertionError(f"--threads {bad} was accepted")
        assert f"{bad!r} is not a thread count" in capsys.readouterr().err


def test_engine_log_reports_each_epochs_engine_and_autos_steps(monkeypatch):
    bench = _load_script()
    from keras_ipu.device.compiler import engine_choice

    class Exe:
        name = "train_step_loop"

    class Tiered:  # stands for a TieredRunner part way through
        last_engine = "tensorflow"
        events = [(10.0, "hot: preparing TensorFlow's engines"), (12.5, "tensorflow ready"),
                  (13.0, "keeps tensorflow")]

    exe, tiered = Exe(), Tiered()
    monkeypatch.setattr(engine_choice, "runner", lambda executable: tiered)
    monkeypatch.setattr(bench.EngineLog, "_installed", None)
    log = bench.EngineLog.installed()
    try:
        assert engine_choice.runner(exe) is tiered  # the Executable's call, noted
        exe._engine_run = tiered
        monkeypatch.setattr(engine_choice, "current_engine", lambda e: e._engine_run.last_engine)
        assert log.engine_now() == "tensorflow"
        assert log.events(since=12.0) == [(0.5, "tensorflow ready"), (1.0, "keeps tensorflow")]
    finally:
        engine_choice.runner = log.runner_wrapped


def _fake_workers(bench, monkeypatch, rates, dies=()):
    """run_worker stood in for: `rates[(variant, model)]` gives each call's
    samples/s in turn; a (variant, model, round) in `dies` dies. Returns
    the calls made, as (variant, model, saved the weights)."""
    calls = []
    left = {key: list(values) for key, values in rates.items()}

    def worker(variant, args, weights_dir, save_weights, result_file, models):
        (name,) = models
        round_index = sum(1 for v, m, _ in calls if (v, m) == (variant, name))
        calls.append((variant, name, save_weights))
        if save_weights:
            bench.weights_file(weights_dir, name).write_bytes(b"w")
        if (variant, name, round_index) in dies:
            return {"error": "worker exited with -9"}
        rate = left[(variant, name)].pop(0)
        return {"threads": {}, "process_wall_s": 1.0, "models": {name: {
            "samples_per_s": rate, "samples_per_s_min": rate - 1,
            "samples_per_s_max": rate + 1, "first_epoch_s": 1000.0 / rate,
            "cpu_ms_per_step": rate / 10, "loss_after_first_epoch": 2.0,
            "epochs": [], "tiering": None}}}

    monkeypatch.setattr(bench, "run_worker", worker)
    return calls


def test_each_model_runs_in_a_worker_of_its_own(monkeypatch, tmp_path):
    # One worker process per model (an earlier model's background compile
    # stays out of the next one's figures); a worker that dies costs its
    # model only, and the next backend builds the weights it did not save.
    bench = _load_script()
    calls = _fake_workers(bench, monkeypatch, {
        ("ipu", "mlp"): [10.0], ("ipu", "lstm"): [30.0], ("jax", "mlp"): [20.0],
        ("jax", "cnn"): [5.0], ("jax", "lstm"): [40.0]}, dies={("ipu", "cnn", 0)})
    args = types.SimpleNamespace(model_list=["mlp", "cnn", "lstm"], rounds=1)
    results, orders, built_by = bench.run_rounds(["ipu", "jax"], args, str(tmp_path))
    assert calls == [("ipu", "mlp", True), ("jax", "mlp", False),
                     ("ipu", "cnn", True), ("jax", "cnn", False),
                     ("ipu", "lstm", True), ("jax", "lstm", False)]
    assert orders == [["ipu", "jax"]]
    assert built_by == {"mlp": "ipu", "cnn": "ipu", "lstm": "ipu"}
    assert results["ipu"]["models"]["cnn"] == {"error": "worker exited with -9"}
    assert results["ipu"]["models"]["lstm"]["samples_per_s"] == 30.0
    assert "rounds" not in results["ipu"]["models"]["lstm"]  # one round: as the worker gave it
    assert results["ipu"]["process_wall_s"] == 2.0
    assert results["jax"]["process_wall_s"] == 3.0


def test_rounds_interleave_the_backends_and_report_medians(monkeypatch, tmp_path):
    bench = _load_script()
    calls = _fake_workers(bench, monkeypatch, {
        ("ipu", "mlp"): [100.0, 300.0, 200.0],
        ("tensorflow", "mlp"): [150.0, 150.0, 150.0],
        ("jax", "mlp"): [120.0, 400.0, 100.0],
        ("ipu-numpy", "mlp"): [90.0, 80.0]}, dies={("ipu-numpy", "mlp", 1)})
    backends = ["ipu", "ipu-numpy", "tensorflow", "jax"]
    args = types.SimpleNamespace(model_list=["mlp"], rounds=3)
    results, orders, built_by = bench.run_rounds(backends, args, str(tmp_path))
    # Round by round, each in a rotated order; the first cell built the weights.
    assert orders == [backends, backends[1:] + backends[:1], backends[2:] + backends[:2]]
    assert [(v, save) for v, _, save in calls] == [
        (b, i == 0) for i, b in enumerate(sum(orders, []))]
    assert built_by == {"mlp": "ipu"}

    ipu = results["ipu"]["models"]["mlp"]
    assert ipu["samples_per_s"] == 200.0  # median of 100, 300, 200
    assert (ipu["samples_per_s_min"], ipu["samples_per_s_max"]) == (100.0, 300.0)
    assert ipu["first_epoch_s"] == 5.0 and ipu["cpu_ms_per_step"] == 20.0
    assert [r["samples_per_s"] for r in ipu["rounds"]] == [100.0, 300.0, 200.0]
    # A round that died is kept as its error; the median is of the others.
    numpy = results["ipu-numpy"]["models"]["mlp"]
    assert numpy["rounds"][1] == {"error": "worker exited with -9"}
    assert numpy["samples_per_s"] == 85.0

    ratios = bench.ratios_over_rounds(results, ["mlp"], 3)["mlp"]
    # The medians: ipu 200 against the faster peer, TensorFlow's 150 (JAX's
    # median is 120); each round against that round's faster peer.
    assert ratios["ipu/best"]["samples_per_s"] == 200.0 / 150.0
    assert ratios["ipu/best"]["samples_per_s_rounds"] == [100 / 150, 300 / 400, 200 / 150]
    assert ratios["ipu/best"]["best_rounds"] == ["tensorflow", "jax", "tensorflow"]
    assert ratios["ipu-numpy/jax"]["samples_per_s_rounds"] == [90 / 120, None, 80 / 100]
    ours = ratios["ours/best"]
    assert (ours["ours"], ours["best"]) == ("ipu", "tensorflow")
    assert ours["ours_rounds"] == ["ipu", "ipu", "ipu"]

    report = {"config": {"models": ["mlp"], "backends": backends, "batch_size": 128,
                         "rounds": 3},
              "results": results, "ratios": bench.ratios_over_rounds(results, ["mlp"], 3)}
    table = bench.format_table(report)
    assert "| samples/s (median) | min..max of 3 rounds |" in table
    assert "| mlp | ipu | 200 | 100...300 |" in table
    assert ("| mlp | ipu/best (tensorflow) | 1.333 | 0.750 | 0.67 (tensorflow), "
            "0.75 (jax), 1.33 (tensorflow) (wins 1 of 3) |") in table
    assert "| mlp | ipu-numpy/jax | 0.708 | 1.417 | 0.75, -, 0.80 (wins 0 of 2) |" in table


def test_round_orders_rotate_by_an_equal_share():
    bench = _load_script()
    six = list("abcdef")
    firsts = [bench.round_order(six, r, 3)[0] for r in range(3)]
    assert firsts == ["a", "c", "e"]
    assert all(sorted(bench.round_order(six, r, 3)) == six for r in range(3))
    assert [bench.round_order(["a", "b"], r, 3) for r in range(3)] == [
        ["a", "b"], ["b", "a"], ["a", "b"]]
    assert bench.round_order([], 0, 1) == []


def test_rounds_must_be_positive(capsys):
    bench = _load_script()
    assert bench.parse_args([]).rounds == 1
    assert bench.parse_args(["--rounds", "3"]).rounds == 3
    try:
        bench.parse_args(["--rounds", "0"])
    except SystemExit as stop:
        assert stop.code == 2
    else:
        raise AssertionError("--rounds 0 was accepted")


SEEDED = """
import sys
sys.path.insert(0, {bench_dir!r})
import keras, fit_throughput as bench
bench.seed_keras(keras, 1234, with_tensorflow={with_tf})
from keras.src.utils import rng_utils
print(rng_utils.get_random_seed(), "tensorflow" in sys.modules,
      [round(float(v), 6) for v in keras.random.uniform((4,))])
"""


def test_seeding_imports_tensorflow_only_with_keras_seed():
    # Without --keras-seed the worker seeds what set_random_seed seeds but
    # TensorFlow, and Keras' generator draws the same numbers.
    outs = []
    for with_tf in (False, True):
        proc = subprocess.run(
            [sys.executable, "-c", SEEDED.format(bench_dir=str(SCRIPT.parent),
                                                 with_tf=with_tf)],
            capture_output=True, text=True, timeout=300,
            env={**os.environ, "KERAS_BACKEND": "ipu", "TF_CPP_MIN_LOG_LEVEL": "2"})
        assert proc.returncode == 0, proc.stderr[-3000:]
        outs.append(proc.stdout.strip().splitlines()[-1])
    seed, loaded, draws = outs[0].split(" ", 2)
    assert (seed, loaded) == ("1234", "False")
    seed_tf, loaded_tf, draws_tf = outs[1].split(" ", 2)
    assert (seed_tf, loaded_tf) == ("1234", "True")
    assert draws == draws_tf


def test_the_engine_log_forgets_an_earlier_models_programs(monkeypatch):
    bench = _load_script()
    from keras_ipu.device.compiler import engine_choice

    class Exe:
        name = "train_step_loop"

    class Tiered:
        last_engine = "xla"
        events = [(20.0, "xla ready")]

    monkeypatch.setattr(engine_choice, "runner", lambda executable: Tiered())
    monkeypatch.setattr(engine_choice, "current_engine", lambda e: e._engine_run.last_engine)
    monkeypatch.setattr(bench.EngineLog, "_installed", None)
    log = bench.EngineLog.installed()
    try:
        earlier = Exe()
        earlier._engine_run = engine_choice.runner(earlier)
        assert log.engine_now() == "xla" and log.events(since=10.0) == [(10.0, "xla ready")]
        log.begin_model()
        assert log.engine_now() is None and log.events(since=10.0) == []
    finally:
        engine_choice.runner = log.runner_wrapped


def test_the_table_shows_each_epoch_and_autos_steps():
    bench = _load_script()
    res = {"samples_per_s": 1000.0, "samples_per_s_min": 900.0, "samples_per_s_max": 1100.0,
           "first_epoch_s": 1.0, "loss_after_first_epoch": 2.0,
           "epochs": [{"epoch": 0, "s": 1.0, "cpu_ms_per_step": 90.0, "engine": "numpy"},
                      {"epoch": 1, "s": 0.5, "cpu_ms_per_step": 80.4, "engine": "tensorflow"}],
           "tiering": [(0.75, "hot: preparing TensorFlow's engines"), (1.2, "keeps tensorflow")]}
    report = {"config": {"models": ["mlp"], "backends": ["ipu"], "batch_size": 100},
              "results": {"ipu": {"models": {"mlp": res}}}, "ratios": {"mlp": {}}}
    assert ("| mlp | ipu | 1.00 s, 90, numpy; 0.50 s, 80, tensorflow | 0.8 hot: preparing "
            "TensorFlow's engines; 1.2 keeps tensorflow |") in bench.format_table(report)


def test_late_splits_are_counted_by_the_rule_and_kernel_that_noted_them(monkeypatch):
    from keras_ipu.device.native import threads

    bench = _load_script()
    # ConcurrencyCounts wraps these in the module: put them back afterwards.
    for name in ("launch", "launch_on_c_pool", "_note_split", "_late", "_backoff"):
        monkeypatch.setattr(threads, name, getattr(threads, name))
    counts = bench.ConcurrencyCounts()

    def a_split_kernel(done):
        threads.note_pool_split(done, 2, 2)

    a_split_kernel((1, 1e-4, 5e-4))  # the caller waited 5x its own time for its helper: late
    a_split_kernel((1, 1e-4, 5e-5))  # on time: not a source
    a_split_kernel((1, 1e-4, 5e-4))
    assert counts.counts["late"] == 2
    assert counts.late_sources_per_step(2) == {"note_pool_split<a_split_kernel": 1.0}
    res = {"samples_per_s": 10.0, "samples_per_s_min": 10.0, "samples_per_s_max": 10.0,
           "first_epoch_s": 1.0, "loss_after_first_epoch": 1.0,
           "concurrency_per_step": counts.per_step(2),
           "late_sources_per_step": {"note_pool_split<a_split_kernel": 1.0,
                                     "_join_on_c_pool<join": 0.5}}
    report = {"config": {"models": ["mlp"], "backends": ["ipu"], "batch_size": 100},
              "results": {"ipu": {"models": {"mlp": res}}}, "ratios": {"mlp": {}}}
    assert ("| mlp | ipu | note_pool_split<a_split_kernel 1.0; _join_on_c_pool<join 0.5 |"
            in bench.format_table(report))
    counts.reset()
    assert counts.late_sources_per_step(1) == {}


# Keras' demo_functional at batch 32 with Adam on two threads: its weight
# gradients and their updates launched as jobs of the C pool
# (concurrent_steps.pairs_with), which the counter must see (they do not
# go through threads.launch). The back-off is off so that a busy machine
# does not run them in the caller.
_C_POOL_COUNTS = r"""
import json, sys
import numpy as np
sys.path.insert(0, sys.argv[1])
import fit_throughput as ft
import keras
from keras_ipu.device.native import product_pool, threads
if not (product_pool.tasks_available() and threads.product_pool_takes(0, np.float32)):
    print(json.dumps(None)); sys.exit(0)
threads.backing_off = lambda: False
counts = ft.ConcurrencyCounts.installed()
size = ft.SIZES["full"]["demo_functional"]
x, y = ft.make_data("demo_functional", size, 4 * 32)
model = ft.build_model(keras, "demo_functional", size)
model.compile(optimizer=ft.make_optimizer(keras, "adam"), loss=ft.make_loss(keras, "demo_functional"))
model.fit(x, y, batch_size=32, epochs=1, verbose=0, shuffle=False)
counts.reset()
model.fit(x, y, batch_size=32, epochs=2, verbose=0, shuffle=False)
print(json.dumps(counts.per_step(8)))
"""


def test_the_concurrency_counts_see_the_c_pools_jobs():
    env = {**os.environ, "KERAS_BACKEND": "ipu", "KERAS_IPU_ENGINE": "numpy",
           "KERAS_IPU_HOST_THREADS": "2"}
    if platform.machine() in ("x86_64", "AMD64"):
        # The count below is the plan on OpenBLAS' Haswell kernels (rows at
        # 12, column tiles: product_pool.rule), where each weight gradient
        # goes with its update; on its SkylakeX kernels (an AVX-512 host
        # without OPENBLAS_CORETYPE) the bits check finds another rule and
        # 2 jobs a step run (issue 16, seventeenth pass). Every x86_64 CPU
        # this project runs on has AVX2. Our own AVX-512 kernel's rule is
        # SkylakeX's (product_pool.native_gemm): off, for OpenBLAS' plan.
        env["OPENBLAS_CORETYPE"] = "Haswell"
        env["KERAS_IPU_NATIVE_GEMM"] = "0"
    proc = subprocess.run(
        [sys.executable, "-c", _C_POOL_COUNTS, str(SCRIPT.parent)],
        capture_output=True, text=True, timeout=600, env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    counts = json.loads(proc.stdout.strip().splitlines()[-1])
    if counts is None:
        pytest.skip("the C pool's jobs are not available")
    # Eight 512x512 weight gradients, each launched with its update.
    assert counts["on_c_pool"] >= 7, counts
    assert counts["launched"] == 0 and counts["ran_in_caller"] == 0, counts
    assert 0 <= counts["c_pool_run_by_caller"] <= counts["on_c_pool"], counts


def test_the_cpu_is_named_by_its_first_processor(tmp_path):
    bench = _load_script()
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(
        "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 26\nmodel\t\t: 2\n"
        "model name\t: AMD EPYC\nflags\t\t: fpu avx2\n\n"
        "processor\t: 1\ncpu family\t: 25\nmodel\t\t: 1\nmodel name\t: Other\n\n")
    assert bench.cpu_model(cpuinfo) == "AMD EPYC (family 26, model 2)"
    assert bench.cpu_model(tmp_path / "missing") is None


def test_the_blas_probe_names_openblas_kernels():
    bench = _load_script()
    peak = bench.blas_peak(1, quick=True)
    assert peak.openblas_gflops > 0
    from threadpoolctl import threadpool_info

    import numpy  # noqa: F401 - loads NumPy's OpenBLAS for threadpoolctl to see
    if any(i.get("internal_api") == "openblas" for i in threadpool_info()):
        assert peak.kernels  # the worker's (its environment's) kernels, e.g. "Haswell"
        assert f"OpenBLAS {peak.kernels} kernels" in peak.describe()


def test_the_blas_peak_is_the_faster_of_openblas_and_our_gemm():
    """Where the engine runs our own gemm (AVX-512 CPUs), the probe times
    it too and the peak is the faster of the two, so no backend's products
    read above the host's limit; elsewhere it is OpenBLAS'."""
    from keras_ipu.device.native import product_pool

    bench = _load_script()
    peak = bench.blas_peak(1, quick=True)
    if product_pool.native_gemm():
        assert peak.native_gflops > 0
        assert peak.gflops == max(peak.openblas_gflops, peak.native_gflops)
        assert "keras_ipu's AVX-512 gemm" in peak.describe()
    else:
        assert peak.native_gflops is None
        assert peak.gflops == peak.openblas_gflops
    env = dict(os.environ, KERAS_IPU_NATIVE_GEMM="0")
    with mock.patch.dict(os.environ, env):
        off = bench.blas_peak(1, quick=True)
    assert off.native_gflops is None and off.gflops == off.openblas_gflops
