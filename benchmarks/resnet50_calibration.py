"""Calibration of the cycle model: ResNet-50 training on one Bow IPU.

    KERAS_BACKEND=ipu python benchmarks/resnet50_calibration.py [--micro-batch 16]

`keras.applications.ResNet50(weights=None)` is built with the Keras dtype
policy "float16" (variables AND computations in float16). That is what
Graphcore's published ResNet-50 figures use: their CNN training runs in
"16.16" precision (float16 weights, activations and gradients, with
stochastic rounding), not "mixed_float16" (16.32: float32 master weights).
Keras' own layers still promote some work to float32 under that policy
(BatchNormalization computes its statistics in float32): the program costed
here is exactly what Keras traces.

The training step (forward, backward, SGD with momentum) is traced and
compiled, never run: keras_ipu's cost model
(keras_ipu/device/simulator/cost_model.py) predicts its cycles on one ipu21
(Bow) IPU, and the images/s are set beside Graphcore's published Bow Pod16
figure, 42,029 images/s over 16 IPUs (about 2,600 per IPU).

Weights, optimizer state and metrics stay on the IPU between steps (no host
traffic); each step streams its images and labels in and the logs out.
"""

import argparse
import collections
import dataclasses
import os
import sys
import time

os.environ.setdefault("KERAS_BACKEND", "ipu")

PUBLISHED_POD16_IMAGES_PER_S = 42029  # Graphcore, Bow Pod16, ResNet-50 training
PUBLISHED_IPUS = 16
PUBLISHED_PER_IPU = PUBLISHED_POD16_IMAGES_PER_S / PUBLISHED_IPUS


@dataclasses.dataclass
class Calibration:
    prediction: object  # keras_ipu Prediction
    executable: object
    micro_batch: int
    breakdown: dict  # category -> cycles per step
    trace_seconds: float
    compile_seconds: float

    @property
    def images_per_second(self):
        return self.prediction.samples_per_second

    @property
    def ratio(self):
        return self.images_per_second / PUBLISHED_PER_IPU


def _category(step):
    if step.kind == "matmul":
        return "conv/matmul"
    if step.kind in ("elementwise", "random"):
        return "elementwise"
    if step.kind == "reduce":
        return "reduce"
    if step.kind in ("copy", "view"):
        return "data movement"
    return step.kind


def trace_train_step(model, x, y):
    """(graph, n_state_inputs, n_state_outputs): the model's stateless
    train step traced for one batch (x, y), without running it."""
    from keras_ipu.backend.trainer_ops import model_state
    from keras_ipu.device.ir import ShapedArray
    from keras_ipu.device.pytree import flatten
    from keras_ipu.device.pytree import unflatten
    from keras_ipu.device.trace import trace_flat

    model._symbolic_build(data_batch=(x, y))
    state = model_state.read_state(
        model_state.state_variables(model, model_state.TRAIN_STATE)
    )
    leaves, structure = flatten((state, (x, y)))
    avals = [ShapedArray(tuple(v.shape), v.dtype) for v in leaves]
    n_state = len(flatten(state)[0])
    counts = {}

    def step(*tracers):
        st, data = unflatten(structure, tracers)
        logs, st = model.train_step(st, data)
        log_leaves = flatten(logs)[0]
        state_leaves = flatten(st)[0]
        counts["logs"] = len(log_leaves)
        counts["state"] = len(state_leaves)
        return log_leaves + state_leaves

    graph, captures = trace_flat(step, avals)
    if captures:
        raise AssertionError("the train step captured outer values")
    n_logs = counts["logs"]
    return graph, n_state, range(n_logs, n_logs + counts["state"])


def calibrate(micro_batch=16, target="ipu21", image_size=224, model_fn=None):
    """Trace and compile ResNet-50's float16 training step, predict it."""
    import keras
    import numpy as np

    from keras_ipu.device.compiler import compile_graph
    from keras_ipu.device.simulator.memory_model import IPUOutOfMemoryError
    from keras_ipu.device.simulator.prediction import predict_costs

    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy("float16")
    try:
        if model_fn is None:
            model = keras.applications.ResNet50(
                weights=None, input_shape=(image_size, image_size, 3))
        else:
            model = model_fn()
        model.compile(
            optimizer=keras.optimizers.SGD(learning_rate=0.01, momentum=0.9),
            loss="sparse_categorical_crossentropy",
        )
        shape = (micro_batch,) + tuple(model.input_shape[1:])
        x = np.zeros(shape, np.float16)
        y = np.zeros((micro_batch,), np.int32)
        t0 = time.perf_counter()
        graph, n_state, state_outputs = trace_train_step(model, x, y)
        t1 = time.perf_counter()
        try:
            exe = compile_graph(graph)
        except IPUOutOfMemoryError as error:
            # The memory model says the step does not fit one IPU (see the
            # table); the compiled program still comes with the error, as
            # Poplar's IPU Model still writes its report: cost it anyway.
            exe = error.executable
        t2 = time.perf_counter()
    finally:
        keras.config.set_dtype_policy(previous)
    pred = predict_costs(
        exe, target=target, batch_size=micro_batch,
        resident_inputs=range(n_state), resident_outputs=state_outputs, log=False,
    )
    breakdown = collections.Counter()
    for s in pred.steps:
        breakdown[_category(s) + " compute"] += s.compute
        breakdown["exchange"] += s.exchange
        breakdown["sync"] += s.sync
    return Calibration(pred, exe, micro_batch, dict(breakdown), t1 - t0, t2 - t1)


def table(cal):
    from keras_ipu.device.simulator import cost_model

    p = cal.prediction
    t = p.target
    step_us = p.step_seconds * 1e6
    host_cycles = p.host_seconds * t.clock_hz
    total = p.cycles_per_step + host_cycles
    lines = [
        f"ResNet-50 training, float16, micro-batch {cal.micro_batch}, one {t.name} "
        f"({t.product}, {t.tiles_per_ipu} tiles, {t.clock_hz / 1e9:g} GHz)",
        f"  traced in {cal.trace_seconds:.1f} s, compiled in {cal.compile_seconds:.1f} s "
        f"({len(p.steps)} program steps, {sum(s.macs for s in p.steps) / 1e9:.1f} GMACs)",
        "",
        f"  {'predicted cycles per step (device)':<40}{p.cycles_per_step:>16,.0f}",
        f"  {'predicted step time':<40}{step_us:>13,.1f} us",
        f"  {'predicted images/s':<40}{cal.images_per_second:>16,.0f}",
        f"  {'published images/s per Bow IPU':<40}{PUBLISHED_PER_IPU:>16,.0f}"
        f"   (Bow Pod16: {PUBLISHED_POD16_IMAGES_PER_S:,} / {PUBLISHED_IPUS})",
        f"  {'ratio predicted / published':<40}{cal.ratio:>16.2f}",
        "",
        f"  {'breakdown per step':<28}{'cycles':>14}{'share':>9}",
    ]
    order = ["conv/matmul compute", "elementwise compute", "reduce compute",
             "data movement compute", "exchange", "sync"]
    rows = [(k, cal.breakdown.get(k, 0)) for k in order]
    rows += [(k, v) for k, v in sorted(cal.breakdown.items()) if k not in order and v]
    rows.append(("host I/O (PCIe)", host_cycles))
    for name, cycles in rows:
        lines.append(f"  {name:<28}{cycles:>14,.0f}{100 * cycles / total:>8.1f}%")
    lines.append(f"  {'total':<28}{total:>14,.0f}")
    m = p.memory
    lines.append("")
    lines.append(
        f"  memory: always live {m.always_live_bytes / 2**20:,.0f} MiB, not always live "
        f"{m.not_always_live_bytes / 2**20:,.0f} MiB of "
        f"{t.sram_bytes_per_ipu / 2**20:,.0f} MiB ("
        + ("fits" if m.fits else f"does not fit: fullest tile {m.tile_bytes / 2**10:,.0f} KiB")
        + ")"
    )
    conv = [s for s in p.steps if s.kind == "matmul"]
    ideal = sum(s.macs for s in conv) / (
        t.tiles_per_ipu * cost_model.macs_per_tile_per_cycle(t, "float16"))
    lines += [
        "",
        "  what the figure rests on (keras_ipu/device/simulator/cost_model.py):",
        f"  - convolutions at MATMUL_EFFICIENCY = {cost_model.MATMUL_EFFICIENCY:g} of the "
        f"fp16 MAC peak (an assumption; at peak they would take {ideal:,.0f} cycles)",
        f"  - elementwise: {cost_model.ELEMENTWISE_LOOP_OVERHEAD_CYCLES} load/store cycles per "
        f"vector and {cost_model.VERTEX_OVERHEAD_CYCLES} cycles per compute set (poplibs' "
        "estimates); Keras' BatchNormalization computes in float32",
        f"  - one sync ({cost_model.SYNC_CYCLES} cycles) per program step; no planner "
        "rearrangements or partial-sum reductions inside a convolution",
    ]
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--micro-batch", type=int, default=16)
    parser.add_argument("--target", default="ipu21")
    parser.add_argument("--steps", action="store_true",
                        help="also print the costliest program steps")
    args = parser.parse_args(argv)
    cal = calibrate(args.micro_batch, args.target)
    print(table(cal))
    if args.steps:
        print()
        print(cal.prediction)
    return 0


if __name__ == "__main__":
    sys.exit(main())
