"""benchmarks/thread_scaling.py's table: samples/s against threads (the
`default` column first whatever order the runs took), the speed-up between
the fewest and most numbered threads, and the ipu ratios per thread count.
Synthetic reports: nothing is timed here."""

import importlib.util
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _load():
    sys.path.insert(0, str(BENCHMARKS))
    try:
        spec = importlib.util.spec_from_file_location(
            "thread_scaling", BENCHMARKS / "thread_scaling.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(BENCHMARKS))


def _report(ipu, jax):
    return {
        "config": {"models": ["mlp"], "backends": ["ipu", "jax"]},
        "results": {"ipu": {"models": {"mlp": {"samples_per_s": ipu}}},
                    "jax": {"models": {"mlp": {"samples_per_s": jax}}}},
        "ratios": {"mlp": {"ipu/jax": {"samples_per_s": ipu / jax}}},
    }


def test_columns_speed_up_and_ratios():
    scaling = _load()
    default = scaling.fit_throughput.DEFAULT_THREADS
    reports = {default: _report(300.0, 600.0), 1: _report(100.0, 50.0),
               4: _report(250.0, 200.0)}
    text = scaling.table(reports, [default, 4, 1])
    assert "| model | backend | default | 1 thr | 4 thr | speed-up 4 vs 1 |" in text
    assert "| mlp | ipu | 300 | 100 | 250 | 2.50x |" in text
    assert "| mlp | jax | 600 | 50 | 200 | 4.00x |" in text
    assert "| mlp | ipu/jax | 0.50 | 2.00 | 1.25 |" in text


def test_a_failed_run_leaves_a_dash():
    scaling = _load()
    reports = {1: _report(100.0, 50.0), 2: _report(180.0, 90.0)}
    reports[2]["results"]["jax"]["models"]["mlp"] = {"error": "worker exited"}
    del reports[2]["ratios"]["mlp"]["ipu/jax"]
    text = scaling.table(reports, [1, 2])
    assert "| mlp | jax | 50 | - | - |" in text
    assert "| mlp | ipu/jax | 2.00 | - |" in text
