"""ResNet-50 training at micro-batch 16 on one Bow IPU with the
recomputation Graphcore used: does it fit, and how fast would it train?

    KERAS_BACKEND=ipu python benchmarks/resnet50_recomputation.py

Graphcore's published Bow Pod16 ResNet-50 figure (42,029 images/s, 16
replicas of one IPU) comes from its TF2 CNN application's MLPerf-style
configuration (graphcore/examples, vision/cnns/tensorflow2/configs.yml,
`resnet50_mlperf_bs16`): micro-batch 16, precision 16.16, SGD with
momentum, the model "pipelined" on ONE IPU (pipeline-splits
conv2_block1_out, conv2_block3_out, conv3_block4_out; device-mapping
[0, 0, 0, 0]; schedule Sequential) with recomputation on, so each of the
four stages keeps only its input and recomputes its activations in the
backward pass, and distributed batch norm over groups of 2 replicas
(dbn-replica-group-size 2), RUNNING_MEAN accumulation, the optimizer
state on the IPU (optimizer-state-offloading: False). 2304 images per
weight update over 16 replicas: 9 micro-batches of 16 per replica.

The same here: `keras.applications.ResNet50(weights=None)` made in an
IPUStrategy scope, split into those four stages, all on IPU 0,
set_pipelining_options(Sequential, RecomputeAndBackpropagateInterleaved),
IPUConfig.allow_recompute and distributed batch norm, one micro-batch's
training step traced and placed (keras_ipu/models/prediction.py), never run.
Without recomputation the step does not fit one IPU (said too).
"""

import argparse
import os
import sys
import time

os.environ.setdefault("KERAS_BACKEND", "ipu")

PUBLISHED_POD16_IMAGES_PER_S = 42029  # Graphcore, Bow Pod16, ResNet-50 training
PUBLISHED_IPUS = 16
PUBLISHED_PER_IPU = PUBLISHED_POD16_IMAGES_PER_S / PUBLISHED_IPUS
MICRO_BATCH = 16
REPLICAS = 16
GLOBAL_BATCH = 2304
ACCUMULATION = GLOBAL_BATCH // (MICRO_BATCH * REPLICAS)  # 9
SPLITS = ("conv2_block1_out", "conv2_block3_out", "conv3_block4_out")


def configure(recompute):
    import keras_ipu as ipu

    config = ipu.config.IPUConfig()
    config.ipu_model.version = "ipu21"
    config.auto_select_ipus = REPLICAS
    config.allow_recompute = recompute
    config.norms.experimental.distributed_batch_norm_replica_group_size = 2
    config.configure_ipu_system()


def build(recompute):
    """ResNet-50 in its four stages on IPU 0 (without allocating weights)."""
    import keras

    import keras_ipu as ipu
    from keras_ipu.ops.pipelining_ops import PipelineSchedule
    from keras_ipu.ops.pipelining_ops import RecomputationMode

    strategy = ipu.ipu_strategy.IPUStrategy()
    optimizer = keras.optimizers.SGD(learning_rate=0.01, momentum=0.9)
    with keras.StatelessScope(initialize_variables=False), strategy.scope():
        model = keras.applications.ResNet50(weights=None)
        model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy")
        model.optimizer.build(model.trainable_variables)
    assignment = model.get_pipeline_stage_assignment()
    stage = 0
    for a in assignment:
        a.pipeline_stage = stage
        if a.layer.name in SPLITS:
            stage += 1
    model.set_pipeline_stage_assignment(assignment)
    kwargs = {"pipeline_schedule": PipelineSchedule.Sequential}
    if recompute:
        kwargs["recomputation_mode"] = RecomputationMode.RecomputeAndBackpropagateInterleaved
    # Graphcore's model_factory passes RUNNING_MEAN and the config's
    # optimizer-state-offloading (False for resnet50_mlperf_bs16).
    model.set_pipelining_options(
        gradient_accumulation_steps_per_replica=ACCUMULATION,
        gradient_accumulation_reduction_method=(
            ipu.optimizers.GradientAccumulationReductionMethod.RUNNING_MEAN),
        offload_weight_update_variables=False,
        device_mapping=[0] * (len(SPLITS) + 1), **kwargs)
    return model


def predict(recompute=True, target="ipu21"):
    import keras

    import keras_ipu as ipu

    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy("float16")
    try:
        configure(recompute)
        model = build(recompute)
        # Tracing must not initialize the variables either.
        with keras.StatelessScope(initialize_variables=False):
            t0 = time.perf_counter()
            prediction = ipu.models.predict_training(
                model, MICRO_BATCH, replicas=REPLICAS, target=target)
            seconds = time.perf_counter() - t0
    finally:
        keras.config.set_dtype_policy(previous)
    return prediction, seconds


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.parse_args(argv)
    for recompute in (False, True):
        prediction, seconds = predict(recompute)
        per_ipu = prediction.samples_per_second / REPLICAS
        print(f"recomputation {'on' if recompute else 'off'} "
              f"(traced and compiled in {seconds:.0f} s):")
        print(prediction)
        print(f"  one IPU: {'fits' if prediction.fits else 'does not fit'}; "
              f"{per_ipu:,.0f} images/s per IPU predicted, {PUBLISHED_PER_IPU:,.0f} "
              f"published (Bow Pod16 {PUBLISHED_POD16_IMAGES_PER_S:,} / {PUBLISHED_IPUS}); "
              f"ratio {per_ipu / PUBLISHED_PER_IPU:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
