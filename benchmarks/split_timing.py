"""Where a fit's split products lose time: per product the C pool splits
(device/native/product_pool.py), how late its helper came and which
thread its two blocks kept waiting, measured inside a fit.

    python benchmarks/split_timing.py                      # MLP b128 SGD, 2 threads
    python benchmarks/split_timing.py --model demo_functional --batch-size 32 --optimizer adam

One row per product shape and blocks (of two row blocks, the first's
rows: the caller's, larger by design: product_pool.HELPER_LATE_FLOPS,
but cut evenly on our own gemm while helpers come in time:
threads.PUNCTUAL_SHARE), over the timed epochs: splits
per step, the share no helper joined (the caller ran both blocks), the
median wall time of the split and the caller's own and waiting time, and
from the C pool's stamps (product_pool.split_timing) the helper's delay
from the split's publication to its first block and how much later the
thread of block 1 ended than that of block 0 (negative: the caller, on
block 0, ended last, as the larger first block intends). The gap is the
wall time since the previous split ended: the step's work that ran on the
caller alone before this split. The numbers a cut is tuned on, measured
where the cut runs (issue 16, fifteenth pass: a standalone product's
best cut was not the fit's).

The NumPy engine, OpenBLAS on one thread, the model, data and optimizer
of fit_throughput.py.
"""

import argparse
import collections
import os
import statistics
import sys
import time


def _median(values, scale=1e6):
    return f"{scale * statistics.median(values):.0f}" if values else "-"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="mlp")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--optimizer", default="sgd", choices=("sgd", "adam"))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=10, help="timed epochs (after 2)")
    args = parser.parse_args(argv)

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import fit_throughput as ft

    os.environ.update(ft.thread_environment(args.threads))
    os.environ["KERAS_BACKEND"] = "ipu"
    os.environ["KERAS_IPU_ENGINE"] = "numpy"
    import keras

    from keras_ipu.device.native import product_pool

    if product_pool.split_timing() is None:
        raise SystemExit("no C pool (or an older build without its stamps)")
    records, recording, last_end = [], [False], [0.0]
    run = product_pool.run

    def timed_run(x, y, out, axis, edges, threads):
        start = time.perf_counter()
        done = run(x, y, out, axis, edges, threads)
        end = time.perf_counter()
        if recording[0] and done is not None:
            count = product_pool.block_count(axis, edges)
            blocks = f"rows, first {int(edges[1])}" if axis == 0 and count == 2 else (
                f"{count} blocks, axis {axis}")
            records.append((x.shape, y.shape, blocks, count, done, end - start,
                            start - last_end[0], product_pool.split_timing()))
        last_end[0] = end
        return done

    # Before the model compiles: its products bind product_pool.run then.
    product_pool.run = timed_run
    size = ft.SIZES["full"][args.model]
    steps = ft.model_steps(argparse.Namespace(steps=None, quick=False), args.model)
    x, y = ft.make_data(args.model, size, steps * args.batch_size)
    keras.utils.set_random_seed(ft.SEED)
    model = ft.build_model(keras, args.model, size)
    model.compile(optimizer=ft.make_optimizer(keras, args.optimizer),
                  loss=ft.make_loss(keras, args.model))
    fit = dict(batch_size=args.batch_size, shuffle=False, verbose=0)
    model.fit(x, y, epochs=2, **fit)
    recording[0] = True
    cpu, wall = time.process_time(), time.perf_counter()
    model.fit(x, y, epochs=args.epochs, **fit)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    total = args.epochs * steps

    print(f"{args.model}, batch {args.batch_size}, {args.optimizer}, {args.threads} threads: "
          f"{1e3 * wall / total:.2f} ms per step, {1e3 * cpu / total:.2f} CPU ms "
          f"({cpu / wall:.2f} cores), {len(records) / total:.2f} C-pool splits per step; "
          f"load {os.getloadavg()[0]:.1f}")
    from keras_ipu.device.native import threads

    # What decided the blocks (threads.wide_splits: from WIDE_MIN_THREADS).
    print(f"wide splits {threads.wide_splits()}")
    print("| product | blocks | per step | no helper joined "
          "| wall us | caller's own us | caller waited us | helper's delay us "
          "| block 1's thread ended later by us | gap before us |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    groups = collections.defaultdict(list)
    for record in records:
        groups[record[:4]].append(record)
    for (xs, ys, blocks, count), rows in sorted(groups.items(), key=lambda g: -len(g[1])):
        alone = sum(r[4][0] == count for r in rows)
        helped = [r for r in rows if r[4][0] < count and r[7][0] >= 0]
        # The imbalance compares two blocks, one on each thread.
        halves = [r for r in helped if count == 2 and r[4][0] == 1]
        print(f"| {xs} @ {ys} | {blocks} | {len(rows) / total:.2f} | {alone / len(rows):.2f} "
              f"| {_median([r[5] for r in rows])} | {_median([r[4][1] for r in rows])} "
              f"| {_median([r[4][2] for r in rows])} | {_median([r[7][0] for r in helped])} "
              f"| {_median([r[7][1] for r in halves])} | {_median([r[6] for r in rows])} |")


if __name__ == "__main__":
    main()
