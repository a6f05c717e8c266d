"""Scale on paper: data-parallel training on 1, 2, 4 processes here, and the
simulator's prediction on 1, 4, 16 and 64 IPUs.

    python benchmarks/multiprocess_scaling.py [--model mlp|resnet50] [--out scaling.json]
    python benchmarks/multiprocess_scaling.py --quick        # smoke test, seconds

Measured (this machine): `python -m keras_ipu.poprun --num-instances N
--num-replicas N` runs the same Keras model with `fit` in a PopDistStrategy
scope, one replica per process, for N in --processes (default 1, 2, 4). The
processes share this machine's cores (2 here), so the numbers measure the
overhead of the processes and of their MPI all-reduce, not a speed-up: the
time of one training step on N processes over the time on one.

Predicted (keras_ipu/device/simulator/cost_model.py): one replica's
training step of the same model is traced, compiled and costed on one IPU
(benchmarks/resnet50_calibration.py's `calibrate`, float16 as Graphcore's
CNN figures); on N IPUs every replica runs it on its own micro-batch and the
gradients are all-reduced as PopDistStrategy compiles it (GCL: a ring over
the IPU-Links inside each Pod64, then over the GW-Links between Pods,
`cost_model.data_parallel_reduction_seconds`). With gradient accumulation
g (`--accumulation 1,8`: one table each) one reduction serves g
micro-batches.

For ResNet-50 (`--model resnet50`: its trace takes a minute or two) the
prediction is set beside Graphcore's published scaling: the Mk2 IPU-POD16
at about 30,000 images/s, 12x that on the IPU-POD256 (M. M. Krell et al.,
"Accelerating ResNet-50 Training on the IPU for MLPerf", Graphcore blog,
January 2022: MLPerf Training v1.1), i.e. 75% of linear scaling from 16 to
256 IPUs. No published scaling exists for the MLP.
"""

import argparse
import dataclasses
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("KERAS_BACKEND", "ipu")

import numpy as np  # noqa: E402

IPU_COUNTS = (1, 4, 16, 64)
PUBLISHED = {
    "resnet50": {
        "source": "Graphcore, MLPerf Training v1.1 (Krell et al., Graphcore blog, Jan 2022): "
        "Mk2 IPU-POD16 about 30,000 images/s, IPU-POD256 12x that",
        "samples_per_s": {16: 30000.0, 256: 12 * 30000.0},
        "target": "ipu2",  # Mk2 GC200: predict on the same IPU
    }
}


# -- the model ------------------------------------------------------------------
def build_model(name, quick=False):
    import keras

    if name == "mlp":
        width = 32 if quick else 512
        return keras.Sequential(
            [keras.Input((784,)), keras.layers.Dense(width, activation="relu"),
             keras.layers.Dense(width, activation="relu"), keras.layers.Dense(10)]
        )
    if name == "resnet50":
        return keras.applications.ResNet50(weights=None)
    raise ValueError(f"--model {name!r}: use mlp or resnet50.")


# -- measured: N processes here -------------------------------------------------
def worker(args):
    """One instance of the measured job (run by keras_ipu.poprun)."""
    import keras

    import keras_ipu.popdist.tensorflow
    from keras_ipu import popdist
    from keras_ipu.config import IPUConfig
    from keras_ipu.distributed.popdist_strategy import PopDistStrategy

    config = keras_ipu.popdist.tensorflow.set_ipu_config(IPUConfig())
    config.configure_ipu_system()
    strategy = PopDistStrategy()
    steps, batch = args.steps, args.micro_batch
    rng = np.random.default_rng(popdist.getInstanceIndex())
    x = rng.normal(size=(steps * batch, 784)).astype(np.float32)
    y = rng.integers(0, 10, size=(steps * batch,)).astype(np.int32)
    keras.utils.set_random_seed(0)
    with strategy.scope():
        model = build_model("mlp", args.quick)
        model.compile(
            optimizer=keras.optimizers.SGD(0.01, momentum=0.9),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            steps_per_execution=steps,
        )
        seconds = []

        class EpochTimes(keras.callbacks.Callback):
            # Epoch by epoch inside one fit: fit's own set-up is not a step.
            def on_epoch_begin(self, epoch, logs=None):
                self.start = time.perf_counter()

            def on_epoch_end(self, epoch, logs=None):
                seconds.append(time.perf_counter() - self.start)

        model.fit(x, y, batch_size=batch, epochs=args.epochs, verbose=0, shuffle=False,
                  callbacks=[EpochTimes()])
    if popdist.getInstanceIndex() == 0:
        with open(args.worker, "w") as f:
            json.dump({"epoch_seconds": seconds}, f)


def measure(args, processes):
    """{N: seconds per step} of the job on N processes (after the first epoch)."""
    results = {}
    for n in processes:
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "worker.json")
            command = [
                sys.executable, "-m", "keras_ipu.poprun", "--num-instances", str(n),
                "--num-replicas", str(n), sys.executable, os.path.abspath(__file__),
                "--worker", out, "--steps", str(args.steps), "--epochs", str(args.epochs),
                "--micro-batch", str(args.micro_batch),
            ] + (["--quick"] if args.quick else [])
            done = subprocess.run(command, capture_output=True, text=True, stdin=subprocess.DEVNULL,
                                  env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
            if done.returncode != 0:
                raise RuntimeError(f"{n} processes failed:\n{done.stderr[-3000:]}")
            with open(out) as f:
                epochs = json.load(f)["epoch_seconds"]
        timed = epochs[1:] or epochs
        results[n] = statistics.median(timed) / args.steps
    return results


# -- predicted: 1 .. 64 IPUs ----------------------------------------------------
@dataclasses.dataclass
class Row:
    ipus: int
    step_seconds: float  # one weight update: g micro-batches and the reduction
    reduction_seconds: float
    samples_per_second: float
    efficiency: float  # samples/s / (ipus x the one-IPU figure)


def _calibration_module():
    path = Path(__file__).resolve().parent / "resnet50_calibration.py"
    spec = importlib.util.spec_from_file_location("resnet50_calibration", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def gradient_bytes(model):
    """Bytes of the gradients the replicas all-reduce: one per trainable weight."""
    return sum(int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize for v in model.trainable_variables)


def predict(model_name, micro_batch, target, accumulations, ipu_counts, quick=False):
    """(one-IPU Prediction, gradient bytes, {g: [Row]}) for the model, one
    table per gradient accumulation count g."""
    from keras_ipu.device.simulator import cost_model

    calibration = _calibration_module()
    built = []

    def model_fn():
        built.append(build_model(model_name, quick))
        return built[-1]

    cal = calibration.calibrate(micro_batch, target, model_fn=model_fn)
    prediction = cal.prediction
    nbytes = gradient_bytes(built[-1])
    tables = {}
    for g in accumulations:
        rows = []
        for n in ipu_counts:
            reduction = cost_model.data_parallel_reduction_seconds(nbytes, n, prediction.target)
            step = g * prediction.step_seconds + reduction
            rows.append(Row(n, step, reduction, n * g * micro_batch / step, 0.0))
        single = rows[0].samples_per_second / rows[0].ipus
        for row in rows:
            row.efficiency = row.samples_per_second / (row.ipus * single)
        tables[g] = rows
    return prediction, nbytes, tables


def table(model_name, prediction, nbytes, rows, measured, accumulation):
    lines = []
    if measured:
        base = measured[min(measured)]
        lines += [
            "Measured on this machine (processes share its cores: overhead, not speed-up)",
            f"  {'processes':>9} {'ms per step':>12} {'vs 1 process':>13}",
        ]
        for n, seconds in sorted(measured.items()):
            lines.append(f"  {n:>9} {seconds * 1e3:>12.2f} {seconds / base:>12.2f}x")
        lines.append("")
    t = prediction.target
    published = PUBLISHED.get(model_name, {}).get("samples_per_s", {})
    lines += [
        f"Predicted on {t.name} ({t.product}): {model_name}, micro-batch "
        f"{prediction.batch_size}, gradient accumulation {accumulation}, "
        f"{nbytes / 1e6:,.1f} MB of gradients",
        f"  {'IPUs':>5} {'step ms':>9} {'all-reduce ms':>14} {'samples/s':>13} "
        f"{'efficiency':>11} {'published samples/s':>20}",
    ]
    for r in rows:
        pub = published.get(r.ipus)
        lines.append(
            f"  {r.ipus:>5} {r.step_seconds * 1e3:>9.3f} {r.reduction_seconds * 1e3:>14.3f} "
            f"{r.samples_per_second:>13,.0f} {r.efficiency:>10.0%} "
            f"{(f'{pub:,.0f}' if pub else '-'):>20}"
        )
    if published:
        lines.append("  published: " + PUBLISHED[model_name]["source"])
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="mlp", choices=("mlp", "resnet50"))
    parser.add_argument("--processes", default="1,2,4")
    parser.add_argument("--ipus", default=",".join(map(str, IPU_COUNTS)))
    parser.add_argument("--micro-batch", type=int, default=32)
    parser.add_argument("--accumulation", default="1,8", help="gradient accumulation counts")
    parser.add_argument("--steps", type=int, default=20, help="steps per epoch (measured)")
    parser.add_argument("--epochs", type=int, default=4, help="epochs (the first is warm-up)")
    parser.add_argument(
        "--target", default=None,
        help="IPU of the prediction (default: the published figures' for resnet50, ipu21 otherwise)",
    )
    parser.add_argument("--quick", action="store_true", help="tiny model, few steps: checks it runs")
    parser.add_argument("--out", default=None, help="JSON report")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    if args.quick:
        args.steps, args.epochs = 2, 2
    if args.target is None:
        args.target = PUBLISHED.get(args.model, {}).get("target", "ipu21")
    ipu_counts = tuple(int(n) for n in args.ipus.split(","))
    if args.model == "resnet50" and 256 not in ipu_counts:
        ipu_counts += (256,)  # where Graphcore's published scaling is
    measured = {}
    if args.model == "mlp":
        measured = measure(args, [int(n) for n in args.processes.split(",")])
    accumulations = [int(g) for g in str(args.accumulation).split(",")]
    prediction, nbytes, tables = predict(
        args.model, args.micro_batch, args.target, accumulations, ipu_counts, args.quick
    )
    for i, (g, rows) in enumerate(tables.items()):
        print(table(args.model, prediction, nbytes, rows, measured if i == 0 else {}, g))
        print()
    if args.out:
        report = {
            "model": args.model, "micro_batch": args.micro_batch, "accumulation": accumulations,
            "target": args.target, "gradient_bytes": nbytes, "quick": args.quick,
            "measured_seconds_per_step": {str(k): v for k, v in measured.items()},
            "predicted": {str(g): [dataclasses.asdict(r) for r in rows] for g, rows in tables.items()},
            "published": PUBLISHED.get(args.model),
        }
        with open(args.out, "w") as f:
            json.dump(report, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
