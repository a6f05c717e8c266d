"""What the NumPy engine's own thread pool (device/native/threads.py) costs
and buys on this machine: the data its thresholds rest on.

    python benchmarks/host_threads.py                 # 1, 2, 4, ... all cores
    python benchmarks/host_threads.py --threads 1,2,4 --out host_threads.json

Tables, wall time (median of --repeats after warm-up; OpenBLAS on one
thread, as the engine sets it, except where OpenBLAS' threads are timed):
  - the pool's round trip: parallel_for over t blocks that do nothing
    (the caller runs them all before a helper wakes: the bookkeeping), and
    over t blocks of a GIL-releasing copy each, beside the caller doing the
    t copies alone (the hand-off to t - 1 helpers and their GIL turns);
    the C pool's (product_pool.py): a tiny product in t blocks on t
    threads beside the same blocks on the caller alone;
  - products of the shapes the benchmark models run (fit_throughput.py's
    MLP, demo_functional, transformer and CNN at their batch sizes, forward
    and gradients, plus a large square one), on one thread (np.matmul) and
    split by matmul_plan over t threads of the C pool (2-d products in
    row or column blocks, batched ones in blocks of batches), the fastest count, and the count the
    policy picks (product_threads, or "N OpenBLAS" where the product goes
    to OpenBLAS' threads: blas_threads_for) for each; then split over the
    Python pool (the engine's without the C pool), then with one block
    per thread instead of BLOCKS_PER_THREAD (fewer hand-offs, no slack
    for a late thread); then on t of OpenBLAS' own threads
    (blas_matmul_plan); each with the process CPU ms per call;
  - the memory-bound kernels of the CNN's step (pads of max pooling's
    gradient, BatchNormalization's sums, pooling, broadcast adds) as the
    engine lowers them (device/native/leading_axis.py) with a cap of t
    threads: wall ms (median and min) and the process's CPU ms per call
    (all threads: what the split costs a busy machine);
  - the C kernels on the C pool's tasks: Keras' Adam update of one
    variable (a fused C chain, the benchmark models' weight shapes) split
    into t element ranges, and row sums (bias and LayerNormalization
    gradients) in t column blocks: same columns as the memory-bound table.
"""

import argparse
import json
import os
import statistics
import time

import numpy as np

# Floats per block of the hand-off table: 64 KiB, above NumPy's threshold
# for releasing the GIL, small enough that the hand-off shows.
HANDOFF_ELEMENTS = 1 << 14
# (label, b, m, n, k): x (b, m, k) @ y (b, k, n); b = 0 for 2-d products.
PRODUCTS = [
    ("mlp fwd 128x784 @ 784x512", 0, 128, 512, 784),
    ("mlp wgrad 512x128 @ 128x784", 0, 512, 784, 128),
    ("mlp fwd 128x512 @ 512x512", 0, 128, 512, 512),
    ("demo fwd 32x512 @ 512x512", 0, 32, 512, 512),
    ("demo wgrad 512x32 @ 32x512", 0, 512, 512, 32),
    ("transformer ff 8192x64 @ 64x128", 0, 8192, 128, 64),
    ("transformer scores 512x(64x16 @ 16x64)", 512, 64, 64, 16),
    ("cnn conv1 131072x27 @ 27x32", 0, 131072, 32, 27),
    ("cnn conv2 32768x288 @ 288x64", 0, 32768, 64, 288),
    ("cnn conv2 wgrad 288x32768 @ 32768x64", 0, 288, 64, 32768),
    ("square 1024^3", 0, 1024, 1024, 1024),
]


_POOL = {"op": "max", "window_dimensions": (1, 2, 2, 1), "window_strides": (1, 2, 2, 1),
         "padding": ((0, 0),) * 4, "base_dilation": (1,) * 4, "window_dilation": (1,) * 4}
# (label, primitive module and name, params, operand shapes; () a scalar)
MEMORY_BOUND = [
    ("cnn pad (pool grad) 128x16x16x32 -> 128x32x32x32", "structure", "pad_p",
     {"config": ((0, 0, 0), (0, 1, 1), (1, 0, 1), (0, 0, 0))}, ((128, 16, 16, 32), ())),
    ("cnn pad (identity) 128x32x32x32", "structure", "pad_p",
     {"config": ((0, 0, 0),) * 4}, ((128, 32, 32, 32), ())),
    ("cnn BN sum 128x32x32x32 -> 32", "reduce", "reduce_sum_p",
     {"axes": (0, 1, 2)}, ((128, 32, 32, 32),)),
    ("cnn max pool 128x32x32x32", "pooling", "reduce_window_p", _POOL,
     ((128, 32, 32, 32),)),
    ("cnn add 128x32x32x32 + 1x1x1x32", "elementwise", "add_p", {},
     ((128, 32, 32, 32), (1, 1, 1, 32))),
]


def memory_bound_rows(host, counts, repeats, rng):
    """Wall (median, min) and process CPU ms per call of each MEMORY_BOUND
    kernel lowered with a cap of t threads."""
    import importlib

    from keras_ipu.device.compiler.lowering import lower
    from keras_ipu.device.ir import ShapedArray

    rows, saved = [], host._cap
    for label, module, name, params, shapes in MEMORY_BOUND:
        prim = getattr(importlib.import_module(f"keras_ipu.device.primitives.{module}"), name)
        xs = [rng.standard_normal(s, dtype=np.float32) if s else np.float32(0)
              for s in shapes]
        avals = tuple(ShapedArray(np.shape(x), np.float32) for x in xs)
        out = prim.abstract_eval(*avals, **params)
        row = {"kernel": label, "wall_ms": {}, "min_ms": {}, "cpu_ms": {}}
        for t in counts:
            host._cap = t
            kernel = lower(prim, params, avals, (out,))
            cpu = time.process_time()
            walls = timed(lambda: kernel(*xs), repeats, keep=True)
            cpu = (time.process_time() - cpu) / (repeats + 3)
            row["wall_ms"][t] = 1e3 * statistics.median(walls)
            row["min_ms"][t] = 1e3 * min(walls)
            row["cpu_ms"][t] = 1e3 * cpu
        rows.append(row)
    host._cap = saved
    return rows


# (label, weight shape): Adam's update chain of one variable.
ADAM_CHAINS = [
    ("adam 512x512 (demo, MLP)", (512, 512)),
    ("adam 784x512 (MLP)", (784, 512)),
    ("adam 128x512", (128, 512)),
]
# (label, rows, cols): float32 sums over the leading axes.
ROW_SUMS = [
    ("sum 8192x128 -> 128 (transformer LN grad)", 8192, 128),
    ("sum 4096x512 -> 512", 4096, 512),
]


def _adam_update(w, m, v, g, lr):
    """Keras' Adam update of one variable, traced: m, v, then w."""
    from keras_ipu.device.primitives import elementwise as ew

    add, sub, mul, c = ew.add_p.bind, ew.sub_p.bind, ew.mul_p.bind, np.float32
    m2 = add(m, mul(sub(g, m), c(0.1)))
    v2 = add(v, mul(sub(mul(g, g), v), c(0.001)))
    step = ew.div_p.bind(mul(m2, lr), add(ew.sqrt_p.bind(v2), c(1e-7)))
    return [sub(w, step), m2, v2]


def c_pool_rows(host, counts, repeats, rng):
    """Wall (median, min) and process CPU ms per call of ADAM_CHAINS and
    ROW_SUMS lowered with a cap of t threads, every t > 1 split on the C
    pool (its element threshold lowered and, for the sums, the streaming
    probe's answer set, to force the split the policy may refuse)."""
    from keras_ipu.device.compiler.executable import Executable
    from keras_ipu.device.compiler.fusion import fuse_elementwise
    from keras_ipu.device.ir import ShapedArray
    from keras_ipu.device.native import leading_sums
    from keras_ipu.device.trace import trace_flat

    rows = []
    saved = host._cap, host.NATIVE_ELEMENTS_PER_THREAD, host.streaming_scales()
    host.NATIVE_ELEMENTS_PER_THREAD, host._streaming_scales = 1, True
    for label, shape in ADAM_CHAINS:
        avals = [ShapedArray(shape, np.float32)] * 4 + [ShapedArray((), np.float32)]
        args = [np.abs(rng.standard_normal(shape, dtype=np.float32)) for _ in range(4)]
        args.append(np.float32(0.001))
        row = {"kernel": label, "wall_ms": {}, "min_ms": {}, "cpu_ms": {}}
        for t in counts:
            host._cap = t
            exe = Executable(fuse_elementwise(trace_flat(_adam_update, avals)[0]))
            (step,) = [s for s in exe._program if getattr(s[0], "native", False)]
            env = exe._template[:]
            env[:5] = args
            kernel, ins = step[0], [env[i] for i in step[1]]
            cpu = time.process_time()
            walls = timed(lambda: kernel(*ins), repeats, keep=True)
            row["cpu_ms"][t] = 1e3 * (time.process_time() - cpu) / (repeats + 3)
            row["wall_ms"][t] = 1e3 * statistics.median(walls)
            row["min_ms"][t] = 1e3 * min(walls)
        rows.append(row)
    for label, r, c in ROW_SUMS:
        x = rng.standard_normal((r, c), dtype=np.float32)
        row = {"kernel": label, "wall_ms": {}, "min_ms": {}, "cpu_ms": {}}
        for t in counts:
            host._cap = t
            kernel = leading_sums.leading_sum_kernel(ShapedArray((r, c), np.float32), (0,))
            cpu = time.process_time()
            walls = timed(lambda: kernel(x), repeats, keep=True)
            row["cpu_ms"][t] = 1e3 * (time.process_time() - cpu) / (repeats + 3)
            row["wall_ms"][t] = 1e3 * statistics.median(walls)
            row["min_ms"][t] = 1e3 * min(walls)
        rows.append(row)
    host._cap, host.NATIVE_ELEMENTS_PER_THREAD, host._streaming_scales = saved
    return rows


def timed(fn, repeats, keep=False):
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times if keep else statistics.median(times)


def main(argv=None):
    from keras_ipu.device.native import threads as host

    cores = len(os.sched_getaffinity(0))
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", help="comma-separated counts (default 1, 2, 4, "
                   f"... up to the {cores} cores this process may use)")
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--out", help="write the tables as JSON")
    args = p.parse_args(argv)
    counts = ([int(t) for t in args.threads.split(",")] if args.threads else
              sorted({min(2 ** i, cores) for i in range(cores.bit_length() + 1)}))
    host.configure()  # OpenBLAS on one thread, as in the engine

    trip = {}
    for t in counts:
        trip[t] = 1e6 * timed(lambda: host.parallel_for(lambda i: None, t, t),
                              args.repeats * 10)
    lines = ["| pool round trip | " + " | ".join(f"{t} thr" for t in counts) + " |",
             "|---|" + "---:|" * len(counts),
             "| us | " + " | ".join(f"{trip[t]:.1f}" for t in counts) + " |", ""]

    # The round trip with work in it: t blocks that each release the GIL
    # for a copy of HANDOFF_ELEMENTS floats (a few microseconds), so the
    # helpers must wake, take the GIL, and hand it back, as a split
    # product's do; beside it the same copies on the caller alone.
    src = np.ones(HANDOFF_ELEMENTS, np.float32)
    dsts = [np.empty_like(src) for _ in range(max(counts))]
    handoff = {}
    for t in counts:
        split = 1e6 * timed(lambda: host.parallel_for(
            lambda i: np.copyto(dsts[i], src), t, t), args.repeats * 10)
        alone = 1e6 * timed(lambda: [np.copyto(dsts[i], src) for i in range(t)],
                            args.repeats * 10)
        handoff[t] = {"split_us": split, "caller_alone_us": alone}
    # Appended to the round-trip table (its header holds the counts).
    lines.insert(3, f"| t copies of {HANDOFF_ELEMENTS} floats, split / caller alone, us | "
                 + " | ".join(f"{handoff[t]['split_us']:.1f} / "
                              f"{handoff[t]['caller_alone_us']:.1f}" for t in counts) + " |")
    from keras_ipu.device.native import product_pool

    native_trip = {}
    if product_pool.available():
        # The C pool's hand-off: t blocks of 16 rows of a 16t x 32 @ 32 x 32
        # product (a few microseconds each) on t threads, and on the caller.
        for t in counts:
            x = np.ones((16 * t, 32), np.float32)
            y, out = np.ones((32, 32), np.float32), np.empty((16 * t, 32), np.float32)
            edges = np.arange(0, 16 * t + 1, 16, dtype=np.int64)
            native_trip[t] = [1e6 * timed(lambda: product_pool.run(x, y, out, 0, edges, n),
                                          args.repeats * 10) for n in (t, 1)]
        lines.insert(4, "| C pool: t blocks of a tiny product, split / caller alone, us | "
                     + " | ".join(f"{native_trip[t][0]:.1f} / {native_trip[t][1]:.1f}"
                                  for t in counts) + " |")

    rng = np.random.default_rng(0)
    rows = []
    default_blocks = host.BLOCKS_PER_THREAD
    # The C pool, our Python pool with its blocks per thread and with one
    # block per thread, and OpenBLAS' own threads (blas_matmul_plan); wall
    # ms, then the process's CPU ms per call (every thread: what the split
    # costs a busy machine).
    for split, blocks in (("c pool", default_blocks), ("pool", default_blocks), ("pool", 1),
                          ("openblas", 0)):
        host.BLOCKS_PER_THREAD = blocks or default_blocks
        if split == "openblas" and not host.blas_thread_setters():
            lines += ["", "OpenBLAS' own threads: not settable here (no pthreads OpenBLAS)"]
            continue
        if split == "c pool" and not product_pool.available():
            lines += ["", "C pool: not available here (product_pool.py)"]
            continue
        title = {"c pool": f"{blocks} block(s) per thread of the C pool",
                 "pool": f"{blocks} block(s) per thread of our Python pool",
                 "openblas": "OpenBLAS' own threads"}[split]
        lines += ["", f"{title} (wall ms / process CPU ms):", "",
                  "| product | MFLOP | " + " | ".join(f"{t} thr" for t in counts)
                  + " | best | policy picks |", "|---|---:|" + "---:|" * (len(counts) + 2)]
        for label, b, m, n, k in PRODUCTS:
            lead = (b,) if b else ()
            x = rng.standard_normal(lead + (m, k), dtype=np.float32)
            y = rng.standard_normal(lead + (k, n), dtype=np.float32)
            flops = 2 * max(b, 1) * m * n * k
            ms, cpu = {}, {}
            for t in counts:
                if split != "openblas":
                    plan = host.matmul_plan(b, m, n, k, np.float32, threads=t,
                                            native=split == "c pool") if t > 1 else None
                else:
                    plan = host.blas_matmul_plan(t)
                fn = (lambda: plan(x, y)) if plan else (lambda: np.matmul(x, y))
                start = time.process_time()
                ms[t] = 1e3 * timed(fn, args.repeats)
                cpu[t] = 1e3 * (time.process_time() - start) / (args.repeats + 3)
            best = min(ms, key=ms.get)
            picks = host.product_threads(b, m, n, k, np.float32)
            # What the engine runs: a 2-d product that splits may go to
            # OpenBLAS' threads instead of our pool (threads.matmul_plan).
            on_blas = 0 if b else host.blas_threads_for(flops)
            rows.append({"product": label, "split": split, "blocks_per_thread": blocks,
                         "mflop": flops / 1e6, "ms": ms, "cpu_ms": cpu, "best": best,
                         "policy": picks, "policy_openblas": on_blas})
            lines.append(f"| {label} | {flops / 1e6:.0f} | "
                         + " | ".join(f"{ms[t]:.3f} / {cpu[t]:.2f}" for t in counts)
                         + f" | {best} | {f'{on_blas} OpenBLAS' if on_blas else picks} |")
    host.BLOCKS_PER_THREAD = default_blocks

    kernels = memory_bound_rows(host, counts, args.repeats, rng)
    lines += ["", "memory-bound kernels (wall ms median / min, process CPU ms):", "",
              "| kernel | " + " | ".join(f"{t} thr" for t in counts) + " |",
              "|---|" + "---:|" * len(counts)]
    for r in kernels:
        lines.append(f"| {r['kernel']} | " + " | ".join(
            f"{r['wall_ms'][t]:.2f} / {r['min_ms'][t]:.2f} / {r['cpu_ms'][t]:.2f}"
            for t in counts) + " |")
    pool_kernels = c_pool_rows(host, counts, args.repeats, rng) if (
        product_pool.tasks_available()) else []
    if pool_kernels:
        lines += ["", "C kernels on the C pool's tasks (wall ms median / min, process CPU ms):",
                  "", "| kernel | " + " | ".join(f"{t} thr" for t in counts) + " |",
                  "|---|" + "---:|" * len(counts)]
        for r in pool_kernels:
            lines.append(f"| {r['kernel']} | " + " | ".join(
                f"{r['wall_ms'][t]:.3f} / {r['min_ms'][t]:.3f} / {r['cpu_ms'][t]:.3f}"
                for t in counts) + " |")
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"threads": counts, "round_trip_us": trip, "handoff": handoff,
                       "c_pool_split_and_alone_us": native_trip,
                       "products": rows,
                       "memory_bound": kernels,
                       "c_pool_kernels": pool_kernels,
                       "flops_per_thread": host.FLOPS_PER_THREAD,
                       "table": text}, f, indent=1)


if __name__ == "__main__":
    main()
