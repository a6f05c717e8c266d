"""The TensorFlow front end on Keras' ResNet-50 training step: compile time
beside TensorFlow's own XLA compile, and step time beside the same model on
the ipu backend.

    python benchmarks/tf_bridge_resnet50.py [--image-size 64] [--batch 4] [--steps 3]
    python benchmarks/tf_bridge_resnet50.py --model tiny --steps 1    # smoke test
    python benchmarks/tf_bridge_resnet50.py --profile                 # where the time goes

Two subprocesses, each with one thread on one core:

- KERAS_BACKEND=tensorflow: `keras.applications.ResNet50(weights=None)`, a
  `tf.GradientTape` train step with SGD (momentum 0.9) in a
  `tf.function(jit_compile=True)`. TensorFlow's own XLA: the trace, then the
  first call (XLA compiles the optimized program to CPU code and runs one
  step), then a steady step. The bridge (keras_ipu.frontends.tensorflow) on
  a second copy of the step: TensorFlow's trace, TensorFlow's lowering to
  HLO (tf2xla, stage "hlo"), the HLO import into the keras_ipu IR, the
  keras_ipu compiler (passes, lowering, memory and cycle checks), then
  steady bridged steps (one executable run each, variables written back).
- KERAS_BACKEND=ipu: the same model and optimizer, `train_on_batch` on the
  same batch: the first call (trace + compile + one step), then steady steps.

Both keras_ipu paths run the simulator on the host CPU (NumPy, one C
kernel for fused elementwise chains): their step times measure that host
execution. Each steady step is timed twice: wall time and the process's CPU
time (time.process_time, all threads), the measure that a busy machine
inflates least.

`--profile` adds where each step's CPU time goes: the call path's phases
(the bridged call: TensorFlow's trace-cache lookup and argument flattening,
the read of the captured variables, the executable's run, the write-back of
the updated variables; the ipu call: the executable's run and Keras'
trainer around it) and the step executable's kernels, run one by one on
the inputs of a real step, by primitive (count and CPU ms per step).

The default image size is 64x64 (224x224 needs
POPLAR_ENGINE_OPTIONS='{"debug.allowOutOfMemory": "true"}' where available:
float32 ResNet-50 training does not fit one simulated IPU's tiles, and
keras_ipu refuses to compile what does not fit, as Poplar does).
Timings on a shared machine are noisy: run it on an idle one.
"""

import argparse
import collections
import json
import os
import statistics
import subprocess
import sys
import time


def _build(keras, model, image_size):
    if model == "resnet50":
        return keras.applications.ResNet50(weights=None, input_shape=(image_size, image_size, 3),
                                           classes=1000)
    inputs = keras.Input((image_size, image_size, 3))
    x = keras.layers.Conv2D(8, 3, strides=2, activation="relu")(inputs)
    x = keras.layers.BatchNormalization()(x)
    x = keras.layers.MaxPooling2D()(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, keras.layers.Dense(10)(x))


def _data(np, batch, image_size, classes):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(batch, image_size, image_size, 3)).astype(np.float32)
    y = (np.arange(batch) % classes).astype(np.int32)
    return x, y


def _median(values):
    return statistics.median(values) if values else None


def _timed_steps(call, steps):
    """(median wall seconds, median CPU seconds, wall list) of `steps` calls."""
    wall, cpu = [], []
    for _ in range(steps):
        t, c = time.perf_counter(), time.process_time()
        call()
        wall.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
    return _median(wall), _median(cpu), wall


class _Phases:
    """CPU seconds spent inside some methods, while profiling: each
    (owner, name, label) is wrapped; nested phases count in both."""

    def __init__(self, methods):
        self.seconds = collections.defaultdict(float)
        self._saved = []
        for owner, name, label in methods:
            original = getattr(owner, name)
            self._saved.append((owner, name, original))
            setattr(owner, name, self._wrap(original, label))

    def _wrap(self, original, label):
        seconds = self.seconds

        def timed(*args, **kwargs):
            start = time.process_time()
            try:
                return original(*args, **kwargs)
            finally:
                seconds[label] += time.process_time() - start

        return timed

    def restore(self):
        for owner, name, original in self._saved:
            setattr(owner, name, original)


def _step_inputs(call):
    """(the Executable with the most kernels that one `call` runs, copies of
    its inputs in that run)."""
    import numpy as np

    from keras_ipu.device.compiler.executable import Executable

    seen = []
    run, run_unchecked = Executable.run, Executable.run_unchecked

    def recording(self, *arrays):
        seen.append((self, [np.array(a) for a in arrays]))  # before donation writes
        return run(self, *arrays)

    def recording_body(self, arrays):  # a loop body (the ipu step's device loop)
        seen.append((self, [np.array(a) for a in arrays]))
        return run_unchecked(self, arrays)

    Executable.run, Executable.run_unchecked = recording, recording_body
    try:
        call()
    finally:
        Executable.run, Executable.run_unchecked = run, run_unchecked
    return max(seen, key=lambda recorded: len(recorded[0]._program))


def _profile(call, steps, methods):
    """The --profile report of a step `call`: CPU ms per step in each phase
    and in the whole step, the step executable's kernels by primitive, its
    node counts after each compiler pass."""
    import step_profile

    phases = _Phases(methods)
    try:
        _, cpu, _ = _timed_steps(call, steps)
    finally:
        phases.restore()
    report = {"phases_ms": {k: 1e3 * v / steps for k, v in phases.seconds.items()}}
    report["phases_ms"]["step (all)"] = 1e3 * cpu
    exe, inputs = _step_inputs(call)
    by_primitive = collections.defaultdict(lambda: [0, 0.0])
    for key, (n, seconds) in step_profile.kernel_times(exe, inputs, steps).items():
        name = key.split(" ", 1)[0]
        by_primitive[name][0] += n // steps
        by_primitive[name][1] += 1e3 * seconds / steps
    report["kernels"] = {k: {"count": n, "cpu_ms": ms} for k, (n, ms) in by_primitive.items()}
    report["passes"] = [list(p) for p in exe.passes]
    report["inputs"], report["outputs"] = len(exe.in_avals), len(exe.out_avals)
    return report


def run_tensorflow(args):
    import numpy as np
    import keras
    import tensorflow as tf

    from keras_ipu.device.compiler.cache import CACHE
    from keras_ipu.frontends.tensorflow.function import bridge
    from keras_ipu.frontends.tensorflow.importer import import_module

    keras.utils.set_random_seed(0)
    model = _build(keras, args.model, args.image_size)
    x, y = _data(np, args.batch, args.image_size, model.output_shape[-1])
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=args.model != "resnet50")

    def make_step():
        opt = keras.optimizers.SGD(0.01, momentum=0.9)
        opt.build(model.trainable_variables)

        def step(x, y):
            with tf.GradientTape() as tape:
                loss = loss_fn(y, model(x, training=True))
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables))
            return loss

        return tf.function(step, jit_compile=True)

    out = {}
    xla = make_step()
    t = time.perf_counter()
    xla.get_concrete_function(x, y)
    out["tf_trace_s"] = time.perf_counter() - t
    t = time.perf_counter()
    xla(x, y)
    out["tf_xla_first_call_s"] = time.perf_counter() - t
    out["tf_xla_step_s"], out["tf_xla_step_cpu_s"], _ = _timed_steps(
        lambda: xla(x, y).numpy(), args.steps)
    # XLA's compile: the first call less a steady step.
    out["tf_xla_compile_s"] = out["tf_xla_first_call_s"] - out["tf_xla_step_s"]

    bridged = bridge(make_step())
    t = time.perf_counter()
    cf = bridged.concrete(x, y)
    out["bridge_tf_trace_s"] = time.perf_counter() - t
    flat, captured = bridged.flat_inputs(cf, (x, y), {})
    t = time.perf_counter()
    module = bridged.hlo_module(cf, flat, captured)
    out["bridge_hlo_s"] = time.perf_counter() - t
    out["hlo_instructions"] = sum(len(c.instructions) for c in module.computations)
    t = time.perf_counter()
    imported = import_module(module)
    out["bridge_import_s"] = time.perf_counter() - t
    out["imported_nodes"] = len(imported.graph.nodes)
    t = time.perf_counter()
    CACHE.get(imported.graph, bridged.options, name="resnet50_bridge_probe")
    out["bridge_compile_s"] = time.perf_counter() - t
    out["bridge_total_compile_s"] = (out["bridge_tf_trace_s"] + out["bridge_hlo_s"]
                                     + out["bridge_import_s"] + out["bridge_compile_s"])
    t = time.perf_counter()
    bridged(x, y)  # the bridge's own program for this trace (the probe above measured its stages)
    out["bridge_first_call_s"] = time.perf_counter() - t
    out["bridge_step_s"], out["bridge_step_cpu_s"], out["bridge_steps_s"] = _timed_steps(
        lambda: float(bridged(x, y)), args.steps)
    if args.profile:
        from keras_ipu.device.compiler.executable import Executable
        from keras_ipu.frontends.tensorflow import captured_variables
        from keras_ipu.frontends.tensorflow import function

        out["profile"] = _profile(lambda: float(bridged(x, y)), args.steps, [
            (function.BridgedFunction, "program",
             "trace lookup, arguments, variable read"),
            (function.BridgedFunction, "_find_trace", "trace lookup, arguments"),
            (captured_variables.CapturedInputs, "read", "variable read"),
            (Executable, "run", "executable run"),
            (captured_variables.CapturedInputs, "write", "variable write-back"),
        ])
    return out


def run_ipu(args):
    import numpy as np
    import keras

    keras.utils.set_random_seed(0)
    model = _build(keras, args.model, args.image_size)
    x, y = _data(np, args.batch, args.image_size, model.output_shape[-1])
    model.compile(optimizer=keras.optimizers.SGD(0.01, momentum=0.9),
                  loss=keras.losses.SparseCategoricalCrossentropy(
                      from_logits=args.model != "resnet50"))
    out = {}
    t = time.perf_counter()
    model.train_on_batch(x, y)
    out["ipu_first_call_s"] = time.perf_counter() - t
    out["ipu_step_s"], out["ipu_step_cpu_s"], out["ipu_steps_s"] = _timed_steps(
        lambda: model.train_on_batch(x, y), args.steps)
    if args.profile:
        from keras_ipu.device.compiler.executable import Executable

        out["profile"] = _profile(lambda: model.train_on_batch(x, y), args.steps,
                                  [(Executable, "run", "executable run")])
    return out


def _child(backend, args):
    env = dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="3",
               OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1",
               TF_NUM_INTRAOP_THREADS="1", TF_NUM_INTEROP_THREADS="1")
    cmd = [sys.executable, __file__, "--child", backend, "--model", args.model,
           "--image-size", str(args.image_size), "--batch", str(args.batch),
           "--steps", str(args.steps)] + (["--profile"] if args.profile else [])
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout,
                          preexec_fn=lambda: os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}))
    if proc.returncode != 0:
        raise RuntimeError(f"the {backend} run failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _profile_lines(bridged, ipu):
    lines = ["", "CPU ms per step by phase:"]
    for name, label in ((bridged, "bridged"), (ipu, "ipu")):
        lines.append(f"  {label}: " + ", ".join(
            f"{k} {v:.1f}" for k, v in sorted(name["phases_ms"].items(), key=lambda kv: -kv[1])))
    lines.append("compiler passes (nodes after each): bridged "
                 + " ".join(f"{k} {n}" for k, n in bridged["passes"])
                 + "; ipu " + " ".join(f"{k} {n}" for k, n in ipu["passes"]))
    lines += ["", "| kernel | bridged count | bridged CPU ms | ipu count | ipu CPU ms |",
              "|---|---:|---:|---:|---:|"]
    names = set(bridged["kernels"]) | set(ipu["kernels"])
    empty = {"count": 0, "cpu_ms": 0.0}
    rows = sorted(names, key=lambda k: -max(bridged["kernels"].get(k, empty)["cpu_ms"],
                                            ipu["kernels"].get(k, empty)["cpu_ms"]))
    for k in rows + ["(all)"]:
        if k == "(all)":
            b = {f: sum(r[f] for r in bridged["kernels"].values()) for f in empty}
            i = {f: sum(r[f] for r in ipu["kernels"].values()) for f in empty}
        else:
            b, i = bridged["kernels"].get(k, empty), ipu["kernels"].get(k, empty)
        lines.append(f"| {k} | {b['count']} | {b['cpu_ms']:.1f} | {i['count']} | {i['cpu_ms']:.1f} |")
    return lines


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=("resnet50", "tiny"), default="resnet50")
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--steps", type=int, default=3, help="timed steps after the first")
    parser.add_argument("--timeout", type=int, default=3600)
    parser.add_argument("--profile", action="store_true",
                        help="also report where each step's CPU time goes (phases, kernels)")
    parser.add_argument("--out", help="write the JSON report here")
    parser.add_argument("--child", choices=("tensorflow", "ipu"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        result = run_tensorflow(args) if args.child == "tensorflow" else run_ipu(args)
        print(json.dumps(result))
        return
    report = {"config": {k: getattr(args, k) for k in ("model", "image_size", "batch", "steps")}}
    report["tensorflow"] = _child("tensorflow", args)
    report["ipu"] = _child("ipu", args)
    tf_, ipu = report["tensorflow"], report["ipu"]
    report["bridge_step_over_ipu_step"] = tf_["bridge_step_s"] / ipu["ipu_step_s"]
    report["bridge_step_cpu_over_ipu_step_cpu"] = tf_["bridge_step_cpu_s"] / ipu["ipu_step_cpu_s"]
    report["bridge_compile_over_tf_xla_compile"] = (
        tf_["bridge_total_compile_s"] / max(tf_["tf_xla_compile_s"], 1e-9))
    lines = [
        f"{args.model}, {args.image_size}x{args.image_size}, batch {args.batch}, one thread",
        f"TensorFlow XLA: trace {tf_['tf_trace_s']:.1f} s, compile {tf_['tf_xla_compile_s']:.1f} s, "
        f"step {tf_['tf_xla_step_s']:.3f} s",
        f"bridge compile: TF trace {tf_['bridge_tf_trace_s']:.1f} s + HLO {tf_['bridge_hlo_s']:.1f} s "
        f"({tf_['hlo_instructions']} instructions) + import {tf_['bridge_import_s']:.1f} s "
        f"({tf_['imported_nodes']} nodes) + keras_ipu compile {tf_['bridge_compile_s']:.1f} s = "
        f"{tf_['bridge_total_compile_s']:.1f} s",
        f"CPU per step: bridged {tf_['bridge_step_cpu_s']:.3f} s, ipu backend "
        f"{ipu['ipu_step_cpu_s']:.3f} s: bridged / ipu = "
        f"{report['bridge_step_cpu_over_ipu_step_cpu']:.2f}",
        f"bridged step {tf_['bridge_step_s']:.3f} s; ipu backend step {ipu['ipu_step_s']:.3f} s "
        f"(first call {ipu['ipu_first_call_s']:.1f} s): bridged / ipu = "
        f"{report['bridge_step_over_ipu_step']:.2f}",
    ]
    if args.profile:
        lines += _profile_lines(tf_["profile"], ipu["profile"])
    report["summary"] = lines
    print("\n".join(lines))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
