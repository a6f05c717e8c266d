"""Trace + compile time of a large model's training step: keras_ipu beside
JAX's `jit` (and TensorFlow with XLA), issue 16 item 5.

    python benchmarks/compile_time.py                       # ResNet-50, batch 8
    python benchmarks/compile_time.py --quick               # a tiny ResNet, seconds

Each backend runs in its own process: Keras' ResNet50 (weights=None,
224x224x3, 1000 classes), SGD with momentum, sparse categorical
cross-entropy; `train_on_batch` is called three times on the same batch.
The first call traces, compiles and runs one step; the later ones only
run. Reported per backend: the import time of Keras with that backend,
the first call, the median of the later calls, and their difference (the
time to trace and compile the step). For keras_ipu the compile is our
compiler (passes, lowering, memory and cycle model) and, with
KERAS_IPU_ENGINE=xla, TensorFlow's import and XLA's compile of the whole
emitted program on top.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

VARIANTS = {
    "ipu-numpy": ("ipu", {"KERAS_IPU_ENGINE": "numpy"}, False),
    "ipu-xla": ("ipu", {"KERAS_IPU_ENGINE": "xla"}, False),
    "jax": ("jax", {"JAX_PLATFORMS": "cpu"}, False),
    "tensorflow-xla": ("tensorflow", {}, True),
}

WORKER = r"""
import json, statistics, sys, time
start = time.perf_counter()
import keras
import numpy as np
imported = time.perf_counter() - start
quick, batch, jit = {quick}, {batch}, {jit}
if quick:
    model = keras.applications.ResNet50(weights=None, input_shape=(32, 32, 3), classes=10)
    classes, shape = 10, (32, 32, 3)
else:
    model = keras.applications.ResNet50(weights=None, input_shape=(224, 224, 3), classes=1000)
    classes, shape = 1000, (224, 224, 3)
model.compile(optimizer=keras.optimizers.SGD(0.01, momentum=0.9),
              loss="sparse_categorical_crossentropy", jit_compile=True if jit else "auto")
rng = np.random.default_rng(0)
x = rng.standard_normal((batch,) + shape, dtype=np.float32)
y = rng.integers(0, classes, (batch,), dtype=np.int32)
times = []
for _ in range(3):
    t = time.perf_counter()
    model.train_on_batch(x, y)
    times.append(time.perf_counter() - t)
print(json.dumps({{"import_s": imported, "first_call_s": times[0],
                  "step_s": statistics.median(times[1:]),
                  "parameters": int(model.count_params())}}))
"""


def run(variant, args):
    backend, extra_env, jit = VARIANTS[variant]
    env = dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="2", **extra_env)
    code = WORKER.format(quick=args.quick, batch=args.batch_size, jit=jit)
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=args.timeout)
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-1:]}
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    out["trace_compile_s"] = out["first_call_s"] - out["step_s"]
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backends", default=",".join(VARIANTS))
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--quick", action="store_true", help="32x32 inputs: a smoke test")
    p.add_argument("--timeout", type=float, default=3600)
    p.add_argument("--out", help="write the results as JSON")
    args = p.parse_args(argv)
    results = {}
    for variant in args.backends.split(","):
        print(f"{variant} ...", file=sys.stderr, flush=True)
        results[variant] = run(variant, args)
    lines = ["| backend | import s | first train_on_batch s | step s "
             "| trace + compile s |", "|---|---:|---:|---:|---:|"]
    for variant, r in results.items():
        if "error" in r:
            lines.append(f"| {variant} | error: {r['error']} | | | |")
        else:
            lines.append(f"| {variant} | {r['import_s']:.1f} | {r['first_call_s']:.1f} | "
                         f"{r['step_s']:.2f} | {r['trace_compile_s']:.1f} |")
    table = "\n".join(lines)
    print(table)
    print(f"\nKeras ResNet50 ({'32x32, quick' if args.quick else '224x224'}), batch "
          f"{args.batch_size}, SGD momentum; threads: each library's default")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"results": results, "table": table,
                       "batch_size": args.batch_size, "quick": args.quick}, f, indent=2)
    return results


if __name__ == "__main__":
    main()
