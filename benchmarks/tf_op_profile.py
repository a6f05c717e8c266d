"""TensorFlow's op profile of a fit step: Keras' TensorFlow backend against
keras_ipu's `tensorflow` engine (our program run by TensorFlow's graph
runtime), on the same model.

    python benchmarks/tf_op_profile.py --model cnn --backend tensorflow
    python benchmarks/tf_op_profile.py --model cnn --backend ipu

Builds one of fit_throughput.py's models under `--backend` (`ipu` runs it
with KERAS_IPU_ENGINE=tensorflow), fits one epoch (the graphs are traced
and optimised), then fits `--steps` more under TensorFlow's profiler and
sums the events of TensorFlow's compute threads by op type: the kernels
the graph runtime ran after Grappler's rewrites (oneDNN's `_Mkl*` names
included), how many per step and their time per step (each event's
elapsed time on its thread: a kernel split over the intra-op pool counts
once, its helpers' time is not added). Prints the table, largest first,
with the process CPU time per step of the profiled epoch. Run both
backends with the same `--threads` and compare ratios measured back to
back: on a shared machine the times are noise, the counts are not.
"""

import argparse
import collections
import glob
import os
import sys
import tempfile
import time


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="cnn")
    p.add_argument("--backend", choices=("ipu", "tensorflow"), default="ipu")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--optimizer", default="sgd", choices=("sgd", "adam"))
    p.add_argument("--steps", type=int, default=10, help="profiled steps")
    p.add_argument("--threads", type=int, default=2,
                   help="TensorFlow's intra- and inter-op threads (as fit_throughput's "
                        "--threads; set before TensorFlow starts)")
    p.add_argument("--top", type=int, default=40, help="rows printed")
    p.add_argument("--quick", action="store_true", help="tiny model sizes (a smoke test)")
    return p.parse_args(argv)


def op_events(logdir):
    """{op type: [events, seconds]} over the compute threads of the host
    plane of the profile written under `logdir`."""
    try:
        from tsl.profiler.protobuf import xplane_pb2
    except ImportError:
        from tensorflow.tsl.profiler.protobuf import xplane_pb2
    path = sorted(glob.glob(os.path.join(logdir, "**", "*.xplane.pb"), recursive=True))[-1]
    space = xplane_pb2.XSpace()
    with open(path, "rb") as f:
        space.ParseFromString(f.read())
    totals = collections.defaultdict(lambda: [0, 0.0])
    for plane in space.planes:
        if not plane.name.startswith("/host:CPU"):
            continue
        names = plane.event_metadata
        for line in plane.lines:
            if not line.name.startswith("tf_Compute") and line.name != "python":
                continue
            for event in line.events:
                name = names[event.metadata_id].name
                # TensorFlow names a kernel's event "node:OpType"; the
                # executor's own events ("ExecutorState::Process", which
                # hold the kernels' events) and tf.data's are left out.
                if ":" not in name or "::" in name or name.startswith("EagerLocalExecute"):
                    continue
                op = name.rsplit(":", 1)[1]
                if not op or " " in op or op.endswith("Dataset"):
                    continue
                totals[op][0] += 1
                totals[op][1] += event.duration_ps * 1e-12
    return totals


def main(argv=None):
    args = parse_args(argv)
    n = str(args.threads)
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "TF_NUM_INTRAOP_THREADS",
                 "TF_NUM_INTEROP_THREADS", "KERAS_IPU_HOST_THREADS"):
        os.environ[name] = n
    os.environ["KERAS_BACKEND"] = args.backend
    if args.backend == "ipu":
        os.environ["KERAS_IPU_ENGINE"] = "tensorflow"
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import keras
    import tensorflow as tf

    import fit_throughput as ft

    if args.backend == "tensorflow":
        tf.config.threading.set_intra_op_parallelism_threads(args.threads)
        tf.config.threading.set_inter_op_parallelism_threads(args.threads)
    size = ft.SIZES["quick" if args.quick else "full"][args.model]
    b = args.batch_size
    x, y = ft.make_data(args.model, size, args.steps * b)
    keras.utils.set_random_seed(ft.SEED)
    model = ft.build_model(keras, args.model, size)
    model.compile(optimizer=ft.make_optimizer(keras, args.optimizer),
                  loss=ft.make_loss(keras, args.model))
    model.fit(x, y, batch_size=b, epochs=2, verbose=0, shuffle=False)

    logdir = tempfile.mkdtemp(prefix="tf_op_profile_")
    tf.profiler.experimental.start(logdir)
    cpu = time.process_time()
    model.fit(x, y, batch_size=b, epochs=1, verbose=0, shuffle=False)
    cpu = time.process_time() - cpu
    tf.profiler.experimental.stop()
    totals = op_events(logdir)
    total = sum(t for _, t in totals.values())
    kernels = sum(c for c, _ in totals.values())
    print(f"{args.model} on {args.backend}, batch {b}, {args.optimizer}, "
          f"{args.threads} threads: {kernels / args.steps:.0f} kernels and "
          f"{1e3 * total / args.steps:.1f} ms of kernel events per step, process "
          f"CPU {1e3 * cpu / args.steps:.1f} ms per step (profiled, {args.steps} steps)")
    print("| op type | per step | ms per step | share |")
    print("|---|---:|---:|---:|")
    rows = sorted(totals.items(), key=lambda kv: -kv[1][1])
    for op, (count, seconds) in rows[:args.top]:
        print(f"| {op} | {count / args.steps:g} | {1e3 * seconds / args.steps:.2f} | "
              f"{100 * seconds / total:.1f}% |")


if __name__ == "__main__":
    main()
