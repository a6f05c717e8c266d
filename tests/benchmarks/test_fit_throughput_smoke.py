"""Smoke test of benchmarks/fit_throughput.py: it runs end to end and writes
the JSON report with its fields. Speed is never asserted here (a unit test
on a shared machine cannot say anything reliable about it)."""

import importlib.util
import json
import os
import subprocess
import sys
import types
from pathlib import Path

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
    assert mlp["concurrency_per_step"] == {"launched": 0.0, "ran_in_caller": 0.0, "late": 0.0}
    # Each epoch's engine (one host thread: auto stays on NumPy, nothing
    # prepared in the background).
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
    # 2 GFLOP per step of 100 samples at 1000 samples/s: 20 GFLOP/s, 40%.
    assert "| mlp | ipu | 1000 | 900...1100 | 20.0 | 40% | 12.3 | 1.00 | 2.0000 |" in (
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
    from keras_ipu.device.compiler import engines

    class Exe:
        name = "train_step_loop"

    class Tiered:  # stands for a TieredRunner part way through
        last_engine = "tensorflow"
        events = [(10.0, "hot: preparing TensorFlow's engines"), (12.5, "tensorflow ready"),
                  (13.0, "keeps tensorflow")]

    exe, tiered = Exe(), Tiered()
    monkeypatch.setattr(engines, "runner", lambda executable: tiered)
    monkeypatch.setattr(bench.EngineLog, "_installed", None)
    log = bench.EngineLog.installed()
    try:
        assert engines.runner(exe) is tiered  # the Executable's call, noted
        exe._engine_run = tiered
        monkeypatch.setattr(engines, "current_engine", lambda e: e._engine_run.last_engine)
        assert log.engine_now() == "tensorflow"
        assert log.events(since=12.0) == [(0.5, "tensorflow ready"), (1.0, "keeps tensorflow")]
    finally:
        engines.runner = log.runner_wrapped


def test_each_model_runs_in_a_worker_of_its_own(monkeypatch, tmp_path):
    # One worker process per model (an earlier model's background compile
    # stays out of the next one's figures); a worker that dies costs its
    # model only.
    bench = _load_script()
    calls = []

    def worker(variant, args, weights_dir, save_weights, result_file, models):
        calls.append(models)
        if models == ["cnn"]:
            return {"error": "worker exited with -9"}
        return {"threads": {}, "process_wall_s": 1.0,
                "models": {m: {"samples_per_s": 1.0} for m in models}}

    monkeypatch.setattr(bench, "run_worker", worker)
    args = types.SimpleNamespace(model_list=["mlp", "cnn", "lstm"])
    info = bench.run_backend("ipu", args, str(tmp_path), save_weights=True)
    assert calls == [["mlp"], ["cnn"], ["lstm"]]
    assert info["models"] == {"mlp": {"samples_per_s": 1.0},
                              "cnn": {"error": "worker exited with -9"},
                              "lstm": {"samples_per_s": 1.0}}
    assert info["process_wall_s"] == 2.0
    args.model_list = ["cnn"]
    assert bench.run_backend("ipu", args, str(tmp_path), False) == {
        "error": "worker exited with -9"}


def test_the_engine_log_forgets_an_earlier_models_programs(monkeypatch):
    bench = _load_script()
    from keras_ipu.device.compiler import engines

    class Exe:
        name = "train_step_loop"

    class Tiered:
        last_engine = "xla"
        events = [(20.0, "xla ready")]

    monkeypatch.setattr(engines, "runner", lambda executable: Tiered())
    monkeypatch.setattr(engines, "current_engine", lambda e: e._engine_run.last_engine)
    monkeypatch.setattr(bench.EngineLog, "_installed", None)
    log = bench.EngineLog.installed()
    try:
        earlier = Exe()
        earlier._engine_run = engines.runner(earlier)
        assert log.engine_now() == "xla" and log.events(since=10.0) == [(10.0, "xla ready")]
        log.begin_model()
        assert log.engine_now() is None and log.events(since=10.0) == []
    finally:
        engines.runner = log.runner_wrapped


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
