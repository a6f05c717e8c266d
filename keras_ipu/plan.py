"""`python -m keras_ipu.plan MODEL.keras --ipus 4 --batch-size 8`: does this
Keras model fit on N IPUs, how should it be split, and how fast would it
train? Prints the automatic pipeline plan (keras_ipu/models/pipeline_planner.py)
without training: the model's training step is traced and compiled for
the simulated IPU, never run.

Options: --gradient-accumulation (micro-batches per weight update; default
2 x IPUs), --schedule (grouped, interleaved, sequential), --ipu (ipu2,
ipu21), --replicas (copies of the pipeline, for the system's samples/s),
--loss / --optimizer (for a model saved without its compile arguments).
Exit status 0 when the plan fits, 1 when it does not.
"""

import argparse
import os
import sys


def _parser():
    p = argparse.ArgumentParser(
        prog="python -m keras_ipu.plan",
        description="Plan a Keras model's pipeline over N simulated IPUs: memory "
                    "per IPU, stage boundaries, predicted training speed.")
    p.add_argument("model", help="a .keras file (keras.Model.save)")
    p.add_argument("--ipus", type=int, required=True, help="IPUs of one pipeline")
    p.add_argument("--batch-size", type=int, required=True, help="samples per micro-batch")
    p.add_argument("--gradient-accumulation", type=int, default=None,
                   help="micro-batches per weight update (default 2 x IPUs)")
    p.add_argument("--schedule", default="grouped",
                   choices=["grouped", "interleaved", "sequential"])
    p.add_argument("--ipu", default="ipu2", choices=["ipu2", "ipu21"],
                   help="IPU version of the simulated system")
    p.add_argument("--replicas", type=int, default=1)
    p.add_argument("--loss", default="mse", help="if the model was saved uncompiled")
    p.add_argument("--optimizer", default="sgd", help="if the model was saved uncompiled")
    return p


def main(argv=None):
    args = _parser().parse_args(argv)
    os.environ.setdefault("KERAS_BACKEND", "ipu")
    import keras

    if keras.backend.backend() != "ipu":
        sys.exit("keras_ipu.plan needs KERAS_BACKEND=ipu (unset it, or set it to ipu).")
    import keras_ipu as ipu
    from keras_ipu.models.pipeline_planner import auto_pipeline
    from keras_ipu.ops.pipelining_ops import PipelineSchedule

    if not os.path.exists(args.model):
        sys.exit(f"{args.model}: no such file. Save the model with model.save('model.keras').")
    config = ipu.config.IPUConfig()
    config.ipu_model.version = args.ipu
    config.auto_select_ipus = 1 << max(0, (args.ipus - 1).bit_length())
    config.configure_ipu_system()
    strategy = ipu.ipu_strategy.IPUStrategy()
    with strategy.scope():
        model = keras.saving.load_model(args.model)
        if getattr(model, "optimizer", None) is None or getattr(model, "loss", None) is None:
            model.compile(optimizer=args.optimizer, loss=args.loss)
    plan = auto_pipeline(
        model, args.ipus, args.batch_size,
        gradient_accumulation=args.gradient_accumulation,
        schedule=PipelineSchedule[args.schedule.capitalize()],
        replicas=args.replicas, print_fn=print,
    )
    return 0 if plan.fits else 1


if __name__ == "__main__":
    sys.exit(main())
