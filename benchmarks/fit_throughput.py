"""Training throughput of `model.fit` under KERAS_BACKEND=ipu, tensorflow and jax.

One run of this script benchmarks every requested backend, each in its own
subprocess (Keras fixes its backend when it is first imported), on the same
models, the same synthetic data (seeded NumPy) and the same initial weights
(the first backend builds each model and saves a .weights.h5 file; the other
backends load it). It prints a table and, with --out, writes it as JSON.

    python benchmarks/fit_throughput.py --out results.json
    python benchmarks/fit_throughput.py --quick --backends ipu --models mlp

Per model and backend it reports:
  - first_epoch_s: wall time of the first epoch, from the start of fit() to
    the end of epoch 1 (tracing, compiling and the first steps included);
  - samples_per_s: the median over the timed epochs (epochs 2..) of
    steps * batch_size / epoch time, i.e. after warm-up;
  - the loss after the first epoch, which should agree across backends
    (same data, weights and order; a check that they ran the same thing).
Ratios ipu/tensorflow and ipu/jax of samples_per_s (> 1: ipu is faster) and
of first_epoch_s (> 1: ipu is slower to start) are computed per model.

Threads: every worker process is pinned to the same --threads CPU cores
(sched_setaffinity) and told to use that many threads in each library:
OMP/OpenBLAS/MKL (NumPy's BLAS, used by the ipu backend's host kernels),
TensorFlow's intra- and inter-op pools and XLA:CPU's Eigen pool (jax).
"""

import argparse
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BACKENDS = ("ipu", "tensorflow", "jax")
# The module whose absence means the backend is not installed.
BACKEND_MODULE = {"ipu": "keras_ipu", "tensorflow": "tensorflow", "jax": "jax"}
MODELS = ("mlp", "cnn", "transformer", "lstm")
BATCH_SIZE = 128
SEED = 1234

# Model and data sizes: full, and tiny ones for --quick (a smoke test).
SIZES = {
    "full": {
        "mlp": {"features": 784, "hidden": 512, "classes": 10},
        "cnn": {"image": 32, "channels": 3, "filters": 32, "classes": 10},
        "transformer": {
            "vocab": 1000, "seq": 64, "dim": 64, "heads": 4, "ff": 128,
            "classes": 2,
        },
        "lstm": {"vocab": 1000, "seq": 32, "dim": 64, "units": 128,
                 "classes": 10},
    },
    "quick": {
        "mlp": {"features": 16, "hidden": 8, "classes": 3},
        "cnn": {"image": 8, "channels": 3, "filters": 4, "classes": 3},
        "transformer": {
            "vocab": 20, "seq": 6, "dim": 8, "heads": 2, "ff": 8,
            "classes": 2,
        },
        "lstm": {"vocab": 20, "seq": 5, "dim": 4, "units": 4, "classes": 3},
    },
}


# --------------------------------------------------------------------------
# Worker side: runs inside one backend's process (keras imported here only).


def build_model(keras, name, size):
    layers = keras.layers
    if name == "mlp":
        return keras.Sequential(
            [
                keras.Input((size["features"],)),
                layers.Dense(size["hidden"], activation="relu"),
                layers.Dense(size["hidden"], activation="relu"),
                layers.Dense(size["classes"]),
            ],
            name="mlp",
        )
    if name == "cnn":
        f = size["filters"]
        return keras.Sequential(
            [
                keras.Input((size["image"], size["image"], size["channels"])),
                layers.Conv2D(f, 3, padding="same"),
                layers.BatchNormalization(),
                layers.ReLU(),
                layers.MaxPooling2D(2),
                layers.Conv2D(2 * f, 3, padding="same"),
                layers.BatchNormalization(),
                layers.ReLU(),
                layers.MaxPooling2D(2),
                layers.Flatten(),
                layers.Dense(size["classes"]),
            ],
            name="cnn",
        )
    if name == "transformer":
        tokens = keras.Input((size["seq"],), dtype="int32")
        x = layers.Embedding(size["vocab"], size["dim"])(tokens)
        attn = layers.MultiHeadAttention(
            size["heads"], size["dim"] // size["heads"]
        )(x, x)
        x = layers.LayerNormalization()(x + attn)
        ff = layers.Dense(size["ff"], activation="relu")(x)
        ff = layers.Dense(size["dim"])(ff)
        x = layers.LayerNormalization()(x + ff)
        x = layers.GlobalAveragePooling1D()(x)
        out = layers.Dense(size["classes"])(x)
        return keras.Model(tokens, out, name="transformer")
    if name == "lstm":
        return keras.Sequential(
            [
                keras.Input((size["seq"],), dtype="int32"),
                layers.Embedding(size["vocab"], size["dim"]),
                layers.LSTM(size["units"]),
                layers.Dense(size["classes"]),
            ],
            name="lstm",
        )
    raise ValueError(f"unknown model {name!r}; choose from {MODELS}")


def make_data(name, size, samples):
    """The same arrays in every backend process: a seeded NumPy generator."""
    import numpy as np

    rng = np.random.default_rng(SEED)
    if name == "mlp":
        x = rng.standard_normal((samples, size["features"]), dtype=np.float32)
    elif name == "cnn":
        shape = (samples, size["image"], size["image"], size["channels"])
        x = rng.standard_normal(shape, dtype=np.float32)
    else:
        x = rng.integers(0, size["vocab"], (samples, size["seq"]),
                         dtype=np.int32)
    y = rng.integers(0, size["classes"], (samples,), dtype=np.int32)
    return x, y


def weights_checksum(model):
    import numpy as np

    return float(sum(np.abs(np.asarray(w, dtype=np.float64)).sum()
                     for w in model.get_weights()))


def run_model(keras, name, size, args, weights_path):
    steps, epochs = args.steps, 1 + args.timed_epochs
    x, y = make_data(name, size, steps * BATCH_SIZE)
    keras.utils.set_random_seed(SEED)
    model = build_model(keras, name, size)
    if args.save_weights:
        model.save_weights(weights_path)
    else:
        model.load_weights(weights_path)
    model.compile(
        optimizer=keras.optimizers.SGD(learning_rate=0.001, momentum=0.9),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        steps_per_execution=args.steps_per_execution,
        jit_compile="auto" if args.jit_compile == "auto" else True,
    )

    marks = {}

    class Clock(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            marks["begin"] = time.perf_counter()

        def on_epoch_begin(self, epoch, logs=None):
            marks[("begin", epoch)] = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            marks[("end", epoch)] = time.perf_counter()
            marks[("loss", epoch)] = float(logs["loss"])

    fit_start = time.perf_counter()
    model.fit(x, y, batch_size=BATCH_SIZE, epochs=epochs, shuffle=False,
              verbose=0, callbacks=[Clock()])
    fit_s = time.perf_counter() - fit_start
    epoch_s = [marks[("end", e)] - marks[("begin", e)]
               for e in range(1, epochs)]
    rates = [steps * BATCH_SIZE / s for s in epoch_s]
    return {
        "samples_per_s": statistics.median(rates) if rates else None,
        "samples_per_s_min": min(rates) if rates else None,
        "samples_per_s_max": max(rates) if rates else None,
        "first_epoch_s": marks[("end", 0)] - marks["begin"],
        "timed_epoch_s": epoch_s,
        "fit_total_s": fit_s,
        "loss_after_first_epoch": marks[("loss", 0)],
        "initial_weights_abs_sum": None,  # filled below
        "jit_compile": bool(model.jit_compile),
        "parameters": int(model.count_params()),
    }


def configure_threads_in_process(backend, threads):
    """The library-level part of the thread settings (after import)."""
    if backend == "tensorflow":
        import tensorflow as tf

        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(threads)
        return {
            "tf_intra_op": tf.config.threading.get_intra_op_parallelism_threads(),
            "tf_inter_op": tf.config.threading.get_inter_op_parallelism_threads(),
        }
    return {}


def worker_main(args):
    backend = os.environ["KERAS_BACKEND"]
    size_table = SIZES["quick" if args.quick else "full"]
    info = {"threads": configure_threads_in_process(backend, args.threads)}
    import keras

    if keras.backend.backend() != backend:
        raise RuntimeError(
            f"keras loaded backend {keras.backend.backend()!r}, "
            f"expected {backend!r}"
        )
    keras.config.set_floatx("float32")
    info["keras"] = keras.__version__
    info["backend_version"] = _backend_version(backend)
    info["affinity"] = sorted(os.sched_getaffinity(0))
    results = {}
    for name in args.models.split(","):
        weights = Path(args.weights_dir) / f"{name}.weights.h5"
        try:
            size = size_table[name]
            res = run_model(keras, name, size, args, weights)
            # The initial weights, reloaded: equal sums across backends
            # show the loading worked.
            model = build_model(keras, name, size)
            model.load_weights(weights)
            res["initial_weights_abs_sum"] = weights_checksum(model)
            results[name] = res
        except Exception as err:  # report and go on with the next model
            results[name] = {"error": f"{type(err).__name__}: {err}"}
        print(f"[{backend}] {name}: {results[name]}", file=sys.stderr,
              flush=True)
    info["models"] = results
    Path(args.result_file).write_text(json.dumps(info))


def _backend_version(backend):
    if backend == "ipu":
        import keras_ipu

        return getattr(keras_ipu, "__version__", "dev")
    module = __import__(BACKEND_MODULE[backend])
    return module.__version__


# --------------------------------------------------------------------------
# Driver side: never imports keras; starts one worker per backend.


def thread_environment(threads):
    """Environment variables that fix each library's thread count; they
    must be set before the library is loaded, hence in the child's env."""
    n = str(threads)
    xla = ("--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
           if threads == 1 else
           f"--xla_cpu_multi_thread_eigen=true "
           f"intra_op_parallelism_threads={threads}")
    return {
        "OMP_NUM_THREADS": n,
        "OPENBLAS_NUM_THREADS": n,
        "MKL_NUM_THREADS": n,
        "TF_NUM_INTRAOP_THREADS": n,
        "TF_NUM_INTEROP_THREADS": n,
        "XLA_FLAGS": xla,
    }


def installed(backend):
    return importlib.util.find_spec(BACKEND_MODULE[backend]) is not None


def run_worker(backend, args, weights_dir, save_weights, result_file):
    env = dict(os.environ)
    env.update(thread_environment(args.threads))
    env["KERAS_BACKEND"] = backend
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    env["JAX_PLATFORMS"] = "cpu"
    cmd = [
        sys.executable, os.path.abspath(__file__), "--worker",
        "--models", ",".join(args.model_list),
        "--steps", str(args.steps),
        "--timed-epochs", str(args.timed_epochs),
        "--steps-per-execution", str(args.steps_per_execution),
        "--threads", str(args.threads),
        "--jit-compile", args.jit_compile,
        "--weights-dir", weights_dir,
        "--result-file", result_file,
    ]
    if args.quick:
        cmd.append("--quick")
    if save_weights:
        cmd.append("--save-weights")
    cores = sorted(os.sched_getaffinity(0))[: args.threads]

    def pin():
        os.sched_setaffinity(0, cores)

    start = time.perf_counter()
    proc = subprocess.run(cmd, env=env, preexec_fn=pin, capture_output=True,
                          text=True, timeout=args.timeout)
    wall = time.perf_counter() - start
    if proc.returncode != 0 or not Path(result_file).exists():
        tail = "\n".join(proc.stderr.strip().splitlines()[-15:])
        return {"error": f"worker exited with {proc.returncode}:\n{tail}"}
    info = json.loads(Path(result_file).read_text())
    info["process_wall_s"] = wall
    return info


def ratios(results, models):
    out = {}
    for name in models:
        ipu = results.get("ipu", {}).get("models", {}).get(name, {})
        row = {}
        for other in ("tensorflow", "jax"):
            ref = results.get(other, {}).get("models", {}).get(name, {})
            if ipu.get("samples_per_s") and ref.get("samples_per_s"):
                row[f"ipu/{other}"] = {
                    "samples_per_s": ipu["samples_per_s"] / ref["samples_per_s"],
                    "first_epoch_s": ipu["first_epoch_s"] / ref["first_epoch_s"],
                }
        out[name] = row
    return out


def format_table(report):
    lines = [
        "| model | backend | samples/s (median) | min..max | first epoch s "
        "| loss after epoch 1 |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for name in report["config"]["models"]:
        for backend in report["config"]["backends"]:
            entry = report["results"].get(backend, {})
            res = entry.get("models", {}).get(name)
            if res is None:
                why = entry.get("skipped") or entry.get("error", "no result")
                lines.append(f"| {name} | {backend} | skipped: "
                             f"{why.splitlines()[0]} | | | |")
            elif "error" in res:
                lines.append(f"| {name} | {backend} | error: "
                             f"{res['error'].splitlines()[0][:80]} | | | |")
            else:
                lines.append(
                    f"| {name} | {backend} | {res['samples_per_s']:.0f} | "
                    f"{res['samples_per_s_min']:.0f}..."
                    f"{res['samples_per_s_max']:.0f} | "
                    f"{res['first_epoch_s']:.2f} | "
                    f"{res['loss_after_first_epoch']:.4f} |"
                )
    lines += ["", "| model | ratio | samples/s ratio (>1: ipu faster) "
              "| first-epoch time ratio (>1: ipu slower) |",
              "|---|---|---:|---:|"]
    for name, row in report["ratios"].items():
        for key, val in row.items():
            lines.append(f"| {name} | {key} | {val['samples_per_s']:.3f} | "
                         f"{val['first_epoch_s']:.3f} |")
    return "\n".join(lines)


def driver_main(args):
    args.model_list = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in args.model_list if m not in MODELS]
    if unknown:
        sys.exit(f"unknown model(s) {unknown}; choose from {','.join(MODELS)}")
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    bad = [b for b in backends if b not in BACKENDS]
    if bad:
        sys.exit(f"unknown backend(s) {bad}; choose from {','.join(BACKENDS)}")
    available = os.sched_getaffinity(0)
    if args.threads > len(available):
        sys.exit(f"--threads {args.threads} is more than the "
                 f"{len(available)} CPU cores this process may use")

    results = {}
    for backend in backends:
        if not installed(backend):
            msg = (f"not installed (no module {BACKEND_MODULE[backend]!r} "
                   f"in {sys.executable}); skipped")
            print(f"backend {backend}: {msg}", file=sys.stderr)
            results[backend] = {"skipped": msg}
    run_order = [b for b in backends if b not in results]
    with tempfile.TemporaryDirectory(prefix="fit_throughput_") as tmp:
        for i, backend in enumerate(run_order):
            # The first backend run builds the models and saves the initial
            # weights; the others load them.
            print(f"backend {backend}: running "
                  f"{','.join(args.model_list)} ...", file=sys.stderr,
                  flush=True)
            results[backend] = run_worker(
                backend, args, tmp, save_weights=(i == 0),
                result_file=os.path.join(tmp, f"{backend}.json"),
            )
            if "error" in results[backend]:
                print(f"backend {backend}: {results[backend]['error']}",
                      file=sys.stderr)
                if i == 0:
                    # Nobody saved the weights: stop rather than compare
                    # differently initialised models.
                    break

    report = {
        "config": {
            "models": args.model_list,
            "backends": backends,
            "batch_size": BATCH_SIZE,
            "dtype": "float32",
            "steps_per_epoch": args.steps,
            "timed_epochs": args.timed_epochs,
            "steps_per_execution": args.steps_per_execution,
            "jit_compile": args.jit_compile,
            "quick": args.quick,
            "sizes": {m: SIZES["quick" if args.quick else "full"][m]
                      for m in args.model_list},
            "optimizer": "SGD(learning_rate=0.001, momentum=0.9)",
            "threads": args.threads,
            "thread_environment": thread_environment(args.threads),
            "cpu_affinity": sorted(available)[: args.threads],
            "cpu_count": os.cpu_count(),
            "python": platform.python_version(),
            "machine": platform.machine(),
            "weights_built_by": run_order[0] if run_order else None,
        },
        "results": results,
        "ratios": ratios(results, args.model_list),
    }
    report["table"] = format_table(report)
    print(report["table"])
    cfg = report["config"]
    print(f"\nbatch {BATCH_SIZE}, float32, {args.steps} steps/epoch, "
          f"{args.timed_epochs} timed epochs after the first, "
          f"steps_per_execution {args.steps_per_execution}, "
          f"threads {args.threads} (cores {cfg['cpu_affinity']}; "
          f"{cfg['thread_environment']})")
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2))
        print(f"JSON written to {args.out}")
    return report


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default=",".join(MODELS),
                   help=f"comma-separated subset of {','.join(MODELS)}")
    p.add_argument("--backends", default=",".join(BACKENDS),
                   help=f"comma-separated subset of {','.join(BACKENDS)}")
    p.add_argument("--steps", type=int, default=None,
                   help="training steps per epoch (default 30, --quick 3)")
    p.add_argument("--timed-epochs", type=int, default=None,
                   help="epochs timed after the first (default 3, --quick 2)")
    p.add_argument("--steps-per-execution", type=int, default=1,
                   help="Keras' steps_per_execution, the same for every backend")
    p.add_argument("--threads", type=int, default=1,
                   help="CPU cores and threads per library for every backend")
    p.add_argument("--jit-compile", choices=("auto", "true"), default="auto",
                   help="auto: each backend's default (TensorFlow on CPU: "
                        "tf.function without XLA); true: XLA for TensorFlow too")
    p.add_argument("--quick", action="store_true",
                   help="tiny models and few steps: a smoke test, not a benchmark")
    p.add_argument("--out", help="write the report as JSON to this path")
    p.add_argument("--timeout", type=float, default=3600,
                   help="seconds allowed per backend process")
    # Internal: the per-backend subprocess.
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--weights-dir", help=argparse.SUPPRESS)
    p.add_argument("--save-weights", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--result-file", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.steps is None:
        args.steps = 3 if args.quick else 30
    if args.timed_epochs is None:
        args.timed_epochs = 2 if args.quick else 3
    if args.steps < 1 or args.timed_epochs < 1 or args.threads < 1:
        p.error("--steps, --timed-epochs and --threads must be >= 1")
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.worker:
        worker_main(args)
    else:
        driver_main(args)


if __name__ == "__main__":
    main()
