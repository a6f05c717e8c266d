"""Samples/s of each backend as the threads grow: 1, 2, 4, ... up to the
cores this process may use (issue 16's scaling curve).

    python benchmarks/thread_scaling.py --out scaling.json
    python benchmarks/thread_scaling.py --threads 1,2,4,8,16 --models mlp,cnn
    python benchmarks/thread_scaling.py --threads default,1,16 --backends ipu,jax

Runs benchmarks/fit_throughput.py once per thread count (every backend
pinned to that many cores, each library told to use that many threads)
and tabulates samples/s per (model, backend) against threads, with the
speed-up from the fewest threads to the most, and the ipu ratios
(ipu / each peer) against threads. Options other than --threads and --out are
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


def table(reports, counts):
    """Markdown: samples/s per (model, backend) against threads with the
    speed-up from the fewest to the most numbered threads, then each ratio
    fit_throughput computes (ipu / each peer) against threads."""
    # Columns in order (default first) whatever order the runs took.
    counts = sorted(counts, key=lambda n: -1 if n == fit_throughput.DEFAULT_THREADS else n)
    numbered = [n for n in counts if n != fit_throughput.DEFAULT_THREADS]
    low, high = (min(numbered), max(numbered)) if numbered else (None, None)
    first = reports[counts[0]]
    head = " | ".join(f"{n} thr" if n != fit_throughput.DEFAULT_THREADS
                      else "default" for n in counts)
    lines = [f"| model | backend | {head} | speed-up {high} vs {low} |",
             "|---|---|" + "---:|" * (len(counts) + 1)]
    ratio_lines = [f"| model | ratio (samples/s, >1: ipu faster) | {head} |",
                   "|---|---|" + "---:|" * len(counts)]
    for model in first["config"]["models"]:
        for backend in first["config"]["backends"]:
            rates = {n: reports[n]["results"].get(backend, {}).get("models", {})
                     .get(model, {}).get("samples_per_s") for n in counts}
            cells = [f"{rates[n]:.0f}" if rates[n] else "-" for n in counts]
            speedup = (f"{rates[high] / rates[low]:.2f}x"
                       if low is not None and rates[low] and rates[high] else "-")
            lines.append(f"| {model} | {backend} | " + " | ".join(cells)
                         + f" | {speedup} |")
        keys = sorted({key for n in counts
                       for key in reports[n]["ratios"].get(model, {})})
        for key in keys:
            cells = []
            for n in counts:
                val = reports[n]["ratios"].get(model, {}).get(key)
                cells.append(f"{val['samples_per_s']:.2f}" if val else "-")
            ratio_lines.append(f"| {model} | {key} | " + " | ".join(cells) + " |")
    return "\n".join(lines + [""] + ratio_lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", help="comma-separated thread counts, "
                   f"'{fit_throughput.DEFAULT_THREADS}' for each library's own "
                   "(no pinning, no thread variables) "
                   f"(default: 1, 2, 4, ... up to the {len(os.sched_getaffinity(0))} "
                   "cores this process may use)")
    p.add_argument("--out", help="write every run's report and the table as "
                   "JSON (rewritten after each thread count, so an interrupted "
                   "run keeps what it measured)")
    args, passthrough = p.parse_known_args(argv)
    counts = ([fit_throughput.parse_threads(t) for t in args.threads.split(",")]
              if args.threads else default_threads())
    reports = {}
    for n in counts:
        print(f"== {n} thread(s)", file=sys.stderr, flush=True)
        fit_args = fit_throughput.parse_args(passthrough + ["--threads", str(n)])
        reports[n] = fit_throughput.driver_main(fit_args)
        done = [c for c in counts if c in reports]
        text = table(reports, done)
        if args.out:
            Path(args.out).write_text(json.dumps(
                {"threads": done, "reports": {str(c): reports[c] for c in done},
                 "table": text}, indent=2))
    print("\n" + text)
    return text


if __name__ == "__main__":
    main()
