"""Where the NumPy engine's time goes in one training step, kernel by kernel.

    python benchmarks/step_profile.py --model demo_functional --batch-size 32 --optimizer adam

Builds one of fit_throughput.py's models under KERAS_BACKEND=ipu with the
NumPy engine, fits one short epoch (so the train program is compiled), then
runs the kernels of the compiled step program (the device loop's body) one
by one on the same inputs and sums each kernel's CPU time (this thread's:
`time.thread_time`, so a busy machine inflates it far less than wall time)
by primitive and output shape. Prints the table, largest first, and the
total per step; `--out` writes it as JSON. `--clock wall` times each
kernel's wall time instead: on a quiet machine, the measure for kernels
split over several threads (this thread's CPU time misses the helpers').

The step on the NumPy engine is the sum of its kernels plus the executor's
Python (Executable.run_unchecked, the device loop, Keras' fit loop), which
this table leaves out: compare its total with fit_throughput.py's
cpu_ms_per_step to see that part.

`--run-loop` instead runs the whole step as the engine does, alternating
the program's order (one kernel after another) with the run loop's
(independent kernels launched beside the next ones:
compiler/concurrent_steps.py) and with the run loop as a loop over its
list of steps (before the straight-line code: compiler/straight_line.py),
checks that all give the same bits, and prints each one's wall time
(median, min) and process CPU time per step: what running kernels at once
buys, and what the straight-line code does, measured in one process (a
quiet machine's measure: on a busy one only the CPU time means much).

`--layers` times one step from the inside out, layers alternating in one
process: the step program (run loop), the device loop's program around it,
fit's train function with the state held between executions and written
after each, a fit epoch, and a fit epoch whose programs are not run (each
returns its first results again: the Python outside the programs alone,
a CPU figure that holds on a busy machine too); each layer minus the one
inside it is what it adds, and the main thread's wall time minus its CPU
time is what it waited for the pool's threads or a core (where fit's time
outside the kernels goes, on a quiet machine). Of that wait, the time it
was runnable but had no core (Linux' /proc/thread-self/schedstat) tells
the two apart: on a busy 2-core machine the run loop and a spinning pool
helper can end up taking turns on one core (issue 16, twenty-first pass).
"""

import argparse
import collections
import contextlib
import gc
import json
import os
import statistics
import sys
import time

import numpy as np


def kernel_times(step, inputs, repeats, clock=time.thread_time, warmup=3):
    """{"<primitive> <output shape>": [kernels, seconds]} of the Executable
    `step`'s kernels run one by one on `inputs`, summed over `repeats` runs
    after `warmup` untimed ones (each run on fresh copies: a kernel may
    write into a donated input)."""
    nodes = step.steps  # one graph node per kernel of step._program
    totals = collections.defaultdict(lambda: [0, 0.0])
    with np.errstate(all="ignore"):  # as Executable.run
        for rep in range(warmup + repeats):
            env = step._template[:]
            env[: step._n_inputs] = [a.copy() for a in inputs]
            for k, (kernel, ins, out, multi, frees) in enumerate(step._program):
                start = clock()
                result = kernel(*[env[i] for i in ins])
                seconds = clock() - start
                if multi:
                    for s, value in zip(out, result):
                        env[s] = value
                else:
                    env[out] = result
                for s in frees:
                    env[s] = None
                if rep < warmup:
                    continue
                node = nodes[k]
                shape = tuple(node.outputs[0].aval.shape) if node.outputs else ()
                key = f"{node.primitive.name} {shape}"
                totals[key][0] += 1
                totals[key][1] += seconds
    return totals


def run_loop_times(step, inputs, repeats):
    """{"program order" | "run loop" | "run loop, stepped": (wall seconds
    list, CPU seconds)} of the Executable `step` run whole, alternating the
    orders on fresh copies of `inputs`: its kernels one after another, and
    the run loop's (independent kernels launched beside the next ones),
    both as the engine runs them (straight-line code: straight_line.py),
    and the run loop as a loop over its list of steps (the run loop before
    issue 16's eighth pass: the Python per kernel that code removes).
    Raises if their results differ."""
    def stepped(steps):
        return lambda arrays: step.run_steps(steps, arrays)

    def straight(steps):  # as Executable.run_unchecked picks
        return step.straight_line(steps) or stepped(steps)

    orders = {
        "program order": straight(step._program),
        "run loop": straight(step._run_program),
        "run loop, stepped": stepped(step._run_program),
    }
    results, times = {}, {name: ([], 0.0) for name in orders}
    with np.errstate(all="ignore"):
        for rep in range(3 + repeats):
            for name, run in orders.items():
                arrays = [a.copy() for a in inputs]
                cpu, start = time.process_time(), time.perf_counter()
                out = run(arrays)
                wall, cpu = time.perf_counter() - start, time.process_time() - cpu
                if rep < 3:
                    results.setdefault(name, out)
                    continue
                walls, total = times[name]
                walls.append(wall)
                times[name] = (walls, total + cpu)
    first, *others = results.values()
    for other in others:
        for a, b in zip(first, other):
            if not np.array_equal(a, b, equal_nan=True):
                raise AssertionError(
                    "the run loop's results differ from the program order's")
    return times


OUTSIDE = "fit epoch, programs not run"


def run_queue_seconds():
    """Seconds this thread has been runnable without a core so far (the
    kernel's schedstat), or None where the kernel does not say."""
    try:
        with open("/proc/thread-self/schedstat") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return None


@contextlib.contextmanager
def programs_not_run():
    """Within: every Executable returns the results of its first run here
    (kept) instead of running its kernels: what is left of a fit epoch is
    the Python outside the programs (Keras' loop, the trainer, the device
    loop, the executable's checks)."""
    from keras_ipu.device.compiler.executable import Executable

    engine, kept = Executable._engine, {}

    def replay(self, arrays):
        if id(self) not in kept:
            kept[id(self)] = (self, engine(self, arrays))
        return list(kept[id(self)][1])

    Executable._engine = replay
    try:
        yield
    finally:
        Executable._engine = engine


def layer_times(model, step, loop, batches, fit, rounds, counts):
    """{"<layer>": (wall ms per step list, process CPU ms per step list,
    main thread CPU ms per step list, the main thread's ms per step
    runnable without a core (run_queue_seconds; empty where unknown), the
    run loop's launches per step (fit_throughput.ConcurrencyCounts
    `counts`))} of one training step
    measured from the inside out, each layer run once per batch of
    `batches` per round, the layers alternating round by round: the step
    program alone (the device loop's body, its run loop, as --run-loop),
    the device loop's program around it (the scan over the infeed), fit's
    train function with the state held between executions
    (trainer_ops/held_state.py) and written after each, `fit` itself (one
    epoch over `batches`: the callable `fit`), and `fit` with no program
    run (programs_not_run: the Python outside the programs). Each layer's
    time minus the one inside it is what that layer adds; the main
    thread's wall minus its CPU time is what it waited (for pool threads,
    or for a core). The programs are fed their own new state back, as the
    trainer does (no copies)."""
    function = model.train_function
    n_state = len(loop.in_avals) - 2  # the infeed: x and y
    rng = np.random.default_rng(0)
    state = [np.asarray(rng.uniform(0.01, 0.1, a.shape)).astype(a.dtype)
             for a in loop.in_avals[:n_state]]
    # The body takes the state first and gives it back first (the scan's carry).
    body_inputs = [np.asarray(rng.uniform(0.01, 0.1, a.shape)).astype(a.dtype)
                   for a in step.in_avals]
    if step.in_avals[:n_state] != step.out_avals[:n_state]:
        raise SystemExit("the step program does not give back its state first")

    def step_program(xb, yb):
        body_inputs[:n_state] = step.run_unchecked(body_inputs)[:n_state]

    def device_loop_program(xb, yb):
        state[:] = loop.run(*state, xb[None], yb[None])[-n_state:]

    def train_function(xb, yb):
        function([(xb, yb)])

    layers = {
        "step program (run loop)": step_program,
        "device loop program": device_loop_program,
        "train function, state held": train_function,
        "train function, state written": train_function,
        "fit epoch": None,
        OUTSIDE: None,
    }
    times = {name: ([], [], [], []) for name in layers}
    launches = {name: collections.Counter() for name in layers}
    for _ in range(rounds):
        for name, run in layers.items():
            hold = function.holding() if name.endswith("held") else contextlib.nullcontext()
            counts.reset()
            with hold, programs_not_run() if name == OUTSIDE else contextlib.nullcontext():
                queued = run_queue_seconds()
                cpu, main, start = time.process_time(), time.thread_time(), time.perf_counter()
                if run is None:
                    fit()
                else:
                    for xb, yb in batches:
                        run(xb, yb)
                wall = time.perf_counter() - start
                cpu, main = time.process_time() - cpu, time.thread_time() - main
                if queued is not None:
                    queued = run_queue_seconds() - queued
            for k, seconds in enumerate((wall, cpu, main)):
                times[name][k].append(1e3 * seconds / len(batches))
            if queued is not None:
                times[name][3].append(1e3 * queued / len(batches))
            launches[name].update(counts.counts)
    steps = rounds * len(batches)
    return {name: (*times[name], {k: round(v / steps, 2) for k, v in launches[name].items()})
            for name in layers}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="demo_functional")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--optimizer", default="adam", choices=("sgd", "adam"))
    parser.add_argument("--repeats", type=int, default=20,
                        help="timed runs of the step's kernels (after 3 untimed)")
    parser.add_argument("--clock", choices=("thread", "wall"), default="thread",
                        help="thread: this thread's CPU time (a busy machine); "
                             "wall: elapsed time (a quiet one; multithreaded kernels)")
    parser.add_argument("--quick", action="store_true", help="tiny model sizes")
    parser.add_argument("--run-loop", action="store_true",
                        help="time the whole step in program order against the "
                             "run loop's (independent kernels at once)")
    parser.add_argument("--layers", action="store_true",
                        help="time one training step from the inside out: the step "
                             "program, the device loop's program, fit's train function "
                             "(state held / written), a fit epoch")
    parser.add_argument("--out", help="JSON report")
    args = parser.parse_args(argv)

    os.environ["KERAS_BACKEND"] = "ipu"
    os.environ["KERAS_IPU_ENGINE"] = "numpy"
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import keras

    import fit_throughput as ft
    from keras_ipu.device.compiler.executable import Executable

    size = ft.SIZES["quick" if args.quick else "full"][args.model]
    x, y = ft.make_data(args.model, size, 4 * args.batch_size)
    keras.utils.set_random_seed(ft.SEED)
    model = ft.build_model(keras, args.model, size)
    model.compile(optimizer=ft.make_optimizer(keras, args.optimizer),
                  loss=ft.make_loss(keras, args.model))
    # Before the programs are built (they bind threads.launch then).
    counts = ft.ConcurrencyCounts.installed() if args.layers else None
    model.fit(x, y, batch_size=args.batch_size, epochs=1, verbose=0, shuffle=False)

    # The step: the executable with the most kernels (the device loop's body).
    step = max((o for o in gc.get_objects() if isinstance(o, Executable)),
               key=lambda e: len(e._program))
    rng = np.random.default_rng(0)
    inputs = [np.asarray(rng.uniform(0.01, 0.1, a.shape)).astype(a.dtype)
              for a in step.in_avals]

    if args.layers:
        loop = next(o for o in gc.get_objects()
                    if isinstance(o, Executable) and o.name == "train_step_loop")
        steps = 30  # an epoch of fit_throughput.py
        xs, ys = ft.make_data(args.model, size, steps * args.batch_size)
        b = args.batch_size
        batches = [(xs[i * b:(i + 1) * b], ys[i * b:(i + 1) * b]) for i in range(steps)]

        def fit():
            model.fit(xs, ys, batch_size=b, epochs=1, verbose=0, shuffle=False)

        times = layer_times(model, step, loop, batches, fit, max(1, args.repeats // steps),
                            counts)
        print(f"{args.model}, batch {args.batch_size}, {args.optimizer}: one step from "
              f"the inside out, {steps} steps per round, layers alternating")
        print("| layer | wall ms per step (median) | min | CPU ms per step (median) "
              "| main thread CPU | main thread waiting (wall - its CPU) "
              "| of which for a core (run queue) "
              "| launched on a Python thread / as C-pool jobs / run by the caller / late, "
              "per step |")
        print("|---|---:|---:|---:|---:|---:|---:|---|")
        for name, (walls, cpus, mains, queued, launches) in times.items():
            launched = " / ".join(str(launches.get(k, "-"))
                                  for k in ("launched", "on_c_pool", "ran_in_caller", "late"))
            waits = [w - m for w, m in zip(walls, mains)]
            for_core = f"{statistics.median(queued):.2f}" if queued else "-"
            print(f"| {name} | {statistics.median(walls):.2f} | {min(walls):.2f} | "
                  f"{statistics.median(cpus):.2f} | {statistics.median(mains):.2f} | "
                  f"{statistics.median(waits):.2f} | {for_core} | {launched} |")
        return

    if args.run_loop:
        launched = sum(getattr(k, "launched", None) is not None for k, *_ in step._run_program)
        print(f"{args.model}, batch {args.batch_size}, {args.optimizer}: "
              f"{len(step._program)} kernels, {launched} launched beside the next ones; "
              f"same bits in both orders; {args.repeats} runs each, alternating")
        print("| order | wall ms median | wall ms min | CPU ms per step |")
        print("|---|---:|---:|---:|")
        for name, (walls, cpu) in run_loop_times(step, inputs, args.repeats).items():
            print(f"| {name} | {1e3 * statistics.median(walls):.2f} | "
                  f"{1e3 * min(walls):.2f} | {1e3 * cpu / args.repeats:.2f} |")
        return

    clock = time.thread_time if args.clock == "thread" else time.perf_counter
    totals = kernel_times(step, inputs, args.repeats, clock)

    rows = sorted(
        ({"kernel": key, "per_step": n // args.repeats,
          "ms_per_step": 1e3 * t / args.repeats} for key, (n, t) in totals.items()),
        key=lambda r: -r["ms_per_step"])
    total = sum(r["ms_per_step"] for r in rows)
    what = "CPU" if args.clock == "thread" else "wall"
    print(f"{args.model}, batch {args.batch_size}, {args.optimizer}: "
          f"{len(step._program)} kernels, {total:.2f} ms {what} per step "
          f"(kernels only; {args.repeats} runs)")
    print("| kernel (primitive, output shape) | per step | ms per step | share |")
    print("|---|---:|---:|---:|")
    for r in rows:
        print(f"| {r['kernel']} | {r['per_step']} | {r['ms_per_step']:.3f} | "
              f"{100 * r['ms_per_step'] / total:.1f}% |")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"model": args.model, "batch_size": args.batch_size,
                       "optimizer": args.optimizer, "clock": args.clock,
                       "kernels_ms_per_step": total,
                       "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
