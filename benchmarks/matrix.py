"""The benchmark matrix of benchmarks/README.md, in one command.

    python benchmarks/matrix.py --out matrix.md              # everything
    python benchmarks/matrix.py --only 1,3 --repeats 1       # some tables

Each table is one benchmarks/fit_throughput.py configuration run
`--repeats` times (all backends in every run, so each run's ratios compare
backends under the same conditions); the table shows per backend the
median over the repeats of samples/s and first-epoch time. Then the trace
+ compile time of ResNet-50 (benchmarks/compile_time.py). Markdown goes to
stdout and `--out`; `--json` keeps every run's report.

"all" threads means every core this process may use. How long it takes
is printed at the end (about 90 minutes on a 2-core machine with the
default 3 repeats; the large models dominate).
"""

import argparse
import copy
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import compile_time  # noqa: E402
import fit_throughput  # noqa: E402

ALL_BACKENDS = "ipu,ipu-numpy,ipu-tensorflow,ipu-xla,tensorflow,tensorflow-xla,jax"
SMALL = "mlp,cnn,transformer,lstm"

# (title, fit_throughput arguments); "all" threads: every core we may use.
TABLES = [
    ("All cores, batch 128, SGD: the four models of issue 3",
     ["--models", SMALL, "--threads", "all", "--batch-size", "128",
      "--optimizer", "sgd"]),
    ("One thread, batch 128, SGD",
     ["--models", SMALL, "--threads", "1", "--batch-size", "128",
      "--optimizer", "sgd"]),
    ("All cores, batch 32, Adam: Keras' default batch size",
     ["--models", "mlp,demo_functional,transformer,lstm", "--threads", "all",
      "--batch-size", "32", "--optimizer", "adam"]),
    ("All cores, batch 128, Adam",
     ["--models", SMALL, "--threads", "all", "--batch-size", "128",
      "--optimizer", "adam"]),
    ("All cores, batch 32, Adam, one busy process beside each backend",
     ["--models", "mlp,demo_functional,lstm", "--threads", "all",
      "--batch-size", "32", "--optimizer", "adam", "--load"]),
    # Batch 64: at 128 ResNet-18's training step does not fit one simulated
    # IPU (IPUOutOfMemoryError, a tile 241 KiB over), so ipu had no figure.
    ("Large models, all cores: ResNet-18 (CIFAR) batch 64, SGD",
     ["--models", "resnet18", "--threads", "all", "--batch-size", "64",
      "--optimizer", "sgd"]),
    # Batch 8: with Adam at 16 or 32 BERT-small's training step does not fit
    # one simulated IPU (at 16 a tile 1.4 KiB over).
    ("Large models, all cores: BERT-small (4 layers, seq 128) batch 8, Adam",
     ["--models", "bert_small", "--threads", "all", "--batch-size", "8",
      "--optimizer", "adam"]),
]


def _median_report(reports):
    """One report whose per-model numbers are the medians over `reports`."""
    merged = copy.deepcopy(reports[0])
    for backend, entry in merged["results"].items():
        for name, res in entry.get("models", {}).items():
            runs = [r["results"][backend]["models"][name] for r in reports
                    if "samples_per_s" in r["results"].get(backend, {})
                    .get("models", {}).get(name, {})]
            if not runs or "error" in res:
                continue
            res["samples_per_s"] = statistics.median(r["samples_per_s"] for r in runs)
            res["samples_per_s_min"] = min(r["samples_per_s_min"] for r in runs)
            res["samples_per_s_max"] = max(r["samples_per_s_max"] for r in runs)
            res["first_epoch_s"] = statistics.median(r["first_epoch_s"] for r in runs)
    merged["ratios"] = fit_throughput.ratios(merged["results"], merged["config"]["models"])
    merged["table"] = fit_throughput.format_table(merged)
    # Each run's ipu/best ratio, to show the spread.
    merged["ratios_per_run"] = [r["ratios"] for r in reports]
    return merged


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--backends", default=ALL_BACKENDS)
    p.add_argument("--only", help="comma-separated table numbers (1-based)")
    p.add_argument("--no-compile-time", action="store_true")
    p.add_argument("--quick", action="store_true", help="tiny models: a smoke test")
    p.add_argument("--out", help="write the Markdown here")
    p.add_argument("--json", help="write every run's report here")
    args = p.parse_args(argv)
    cores = str(len(os.sched_getaffinity(0)))
    chosen = ([int(i) for i in args.only.split(",")] if args.only
              else range(1, len(TABLES) + 1))
    started = time.perf_counter()
    sections, raw = [], {}
    for number in chosen:
        title, fit_args = TABLES[number - 1]
        fit_args = [cores if a == "all" else a for a in fit_args]
        fit_args += ["--backends", args.backends] + (["--quick"] if args.quick else [])
        reports = []
        for repeat in range(args.repeats):
            print(f"== table {number} ({title}), run {repeat + 1}/{args.repeats}",
                  file=sys.stderr, flush=True)
            reports.append(fit_throughput.driver_main(fit_throughput.parse_args(fit_args)))
        merged = _median_report(reports)
        raw[title] = reports
        cfg = merged["config"]
        sections.append(
            f"### {number}. {title}\n\n"
            f"threads {cfg['threads']}, batch {cfg['batch_size']}, {cfg['optimizer']}, "
            f"steps/epoch {cfg['steps_per_epoch']}, {cfg['timed_epochs']} timed epochs, "
            f"BLAS peak {cfg['blas_peak_gflops'] and round(cfg['blas_peak_gflops'], 1)} "
            f"GFLOP/s, medians of {len(reports)} run(s)\n\n{merged['table']}\n")
    if not args.no_compile_time:
        print("== ResNet-50 trace + compile", file=sys.stderr, flush=True)
        results = compile_time.main(["--quick"] if args.quick else [])
        raw["compile_time"] = results
        lines = ["| backend | import s | first train_on_batch s | step s | trace + compile s |",
                 "|---|---:|---:|---:|---:|"]
        for variant, r in results.items():
            if "error" not in r:
                lines.append(f"| {variant} | {r['import_s']:.1f} | {r['first_call_s']:.1f} | "
                             f"{r['step_s']:.2f} | {r['trace_compile_s']:.1f} |")
        sections.append("### ResNet-50 training step: trace + compile (batch 8)\n\n"
                        + "\n".join(lines) + "\n")
    minutes = (time.perf_counter() - started) / 60
    text = "\n".join(sections) + f"\n(matrix took {minutes:.0f} min)\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    if args.json:
        Path(args.json).write_text(json.dumps(raw, indent=2, default=str))


if __name__ == "__main__":
    main()
