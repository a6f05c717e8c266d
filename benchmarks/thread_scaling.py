"""Samples/s of each backend as the threads grow: 1, 2, 4, ... up to the
cores this process may use (issue 16's scaling curve).

    python benchmarks/thread_scaling.py --out scaling.json
    python benchmarks/thread_scaling.py --threads 1,2,4,8,16 --models mlp,cnn

Runs benchmarks/fit_throughput.py once per thread count (every backend
pinned to that many cores, each library told to use that many threads)
and tabulates samples/s per (model, backend) against threads, with the
speed-up over one thread. Options other than --threads and --out are
passed through to fit_throughput.py (--models, --backends, --batch-size,
--optimizer, --steps, --load, ...).
"""

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fit_throughput  # noqa: E402


def default_threads():
    cores = len(os.sched_getaffinity(0))
    counts, n = [], 1
    while n < cores:
        counts.append(n)
        n *= 2
    counts.append(cores)
    return counts


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", help="comma-separated thread counts "
                   f"(default: 1, 2, 4, ... up to the {len(os.sched_getaffinity(0))} "
                   "cores this process may use)")
    p.add_argument("--out", help="write every run's report and the table as JSON")
    args, passthrough = p.parse_known_args(argv)
    counts = ([int(t) for t in args.threads.split(",")] if args.threads
              else default_threads())
    reports = {}
    for n in counts:
        print(f"== {n} thread(s)", file=sys.stderr, flush=True)
        fit_args = fit_throughput.parse_args(passthrough + ["--threads", str(n)])
        reports[n] = fit_throughput.driver_main(fit_args)
    first = reports[counts[0]]
    lines = ["| model | backend | " + " | ".join(f"{n} thr" for n in counts)
             + f" | speed-up {counts[-1]} vs {counts[0]} |",
             "|---|---|" + "---:|" * (len(counts) + 1)]
    for model in first["config"]["models"]:
        for backend in first["config"]["backends"]:
            rates = []
            for n in counts:
                res = reports[n]["results"].get(backend, {}).get("models", {}).get(model, {})
                rates.append(res.get("samples_per_s"))
            cells = [f"{r:.0f}" if r else "-" for r in rates]
            speedup = (f"{rates[-1] / rates[0]:.2f}x" if rates[0] and rates[-1] else "-")
            lines.append(f"| {model} | {backend} | " + " | ".join(cells) + f" | {speedup} |")
    table = "\n".join(lines)
    print("\n" + table)
    if args.out:
        Path(args.out).write_text(json.dumps(
            {"threads": counts, "reports": {str(n): r for n, r in reports.items()},
             "table": table}, indent=2))
    return table


if __name__ == "__main__":
    main()
