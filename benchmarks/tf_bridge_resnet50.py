"""The TensorFlow front end on Keras' ResNet-50 training step: compile time
beside TensorFlow's own XLA compile, and step time beside the same model on
the ipu backend.

    python benchmarks/tf_bridge_resnet50.py [--image-size 64] [--batch 4] [--steps 3]
    python benchmarks/tf_bridge_resnet50.py --model tiny --steps 1    # smoke test

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
execution. The default image size is 64x64 (224x224 needs
POPLAR_ENGINE_OPTIONS='{"debug.allowOutOfMemory": "true"}' where available:
float32 ResNet-50 training does not fit one simulated IPU's tiles, and
keras_ipu refuses to compile what does not fit, as Poplar does).
Timings on a shared machine are noisy: run it on an idle one.
"""

import argparse
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
    steps = []
    for _ in range(args.steps):
        t = time.perf_counter()
        xla(x, y).numpy()
        steps.append(time.perf_counter() - t)
    out["tf_xla_step_s"] = _median(steps)
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
    steps = []
    for _ in range(args.steps):
        t = time.perf_counter()
        float(bridged(x, y))
        steps.append(time.perf_counter() - t)
    out["bridge_step_s"] = _median(steps)
    out["bridge_steps_s"] = steps
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
    steps = []
    for _ in range(args.steps):
        t = time.perf_counter()
        model.train_on_batch(x, y)
        steps.append(time.perf_counter() - t)
    out["ipu_step_s"] = _median(steps)
    out["ipu_steps_s"] = steps
    return out


def _child(backend, args):
    env = dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="3",
               OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1",
               TF_NUM_INTRAOP_THREADS="1", TF_NUM_INTEROP_THREADS="1")
    cmd = [sys.executable, __file__, "--child", backend, "--model", args.model,
           "--image-size", str(args.image_size), "--batch", str(args.batch),
           "--steps", str(args.steps)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout,
                          preexec_fn=lambda: os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}))
    if proc.returncode != 0:
        raise RuntimeError(f"the {backend} run failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=("resnet50", "tiny"), default="resnet50")
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--steps", type=int, default=3, help="timed steps after the first")
    parser.add_argument("--timeout", type=int, default=3600)
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
        f"bridged step {tf_['bridge_step_s']:.3f} s; ipu backend step {ipu['ipu_step_s']:.3f} s "
        f"(first call {ipu['ipu_first_call_s']:.1f} s): bridged / ipu = "
        f"{report['bridge_step_over_ipu_step']:.2f}",
    ]
    report["summary"] = lines
    print("\n".join(lines))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
