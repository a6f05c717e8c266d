"""A functional pipeline's program placed and simulated as the Keras
pipelines are.

The TensorFlow front end imports the program; the PipelineRun that
pipelining_ops.pipeline recorded while it was traced (pipeline_runs.py)
says what the HLO cannot: the IPU of each stage, the schedule, the
micro-batches per weight update, the recomputation mode. Then:

- placement: each node on the stage of its TensorFlow op's name scope
  `pipeline_stage_<k>` (the front end's frontends/tensorflow/stages.py: a
  stage's gradient ops carry its scope too), stage k on IPU
  device_mapping[k], the rest where the values it reads are (the compiler's
  placement pass, as for a Keras pipeline); the copies between IPUs are in
  the executable, its memory is per IPU;
- recomputation: with IPUConfig.allow_recompute, a training pipeline
  compiles with its recomputation mode, Auto resolved by the schedule
  (models/options.resolved_recomputation_mode, as a Keras pipeline);
- time and memory: the executable's prediction applies the schedule
  (placement_of gives the front end the record it compiles with,
  ops/pipeline_placement.py; device/simulator/sharding.predict_sharded,
  the one model of Keras pipelines too): the loop body is one
  micro-batch, per-IPU forward and backward cycles, the stash of
  micro-batches in flight under the schedule, bubbles, the weight update
  once per step (`gradient_accumulation_count` micro-batches).

Before the program first runs, the prediction goes to the cycle log
(TF_POPLAR_FLAGS=--log_cycle_count) and an IPU that cannot hold its stages
fails with IPUOutOfMemoryError naming the IPU and its stages, as a Keras
pipeline's first fit does. Values never depend on any of it.
"""

import dataclasses
import logging

from keras_ipu.frontends.tensorflow.stages import pipeline_stage_of

# The name scope of the gradient accumulation and the weight update
# (functional_pipeline.py); its conditional applies the update once per step.
WEIGHT_UPDATE_SCOPE = "pipeline_weight_update"


def the_pipeline(runs):
    """The one PipelineRun of a program's recorded runs (None if none)."""
    if not runs:
        return None
    first = runs[0]
    if any(r.device_mapping != first.device_mapping for r in runs[1:]):
        raise NotImplementedError(
            "A program with several functional pipelines of different device mappings "
            f"({[list(r.device_mapping) for r in runs]}) is not supported by keras_ipu: "
            "its stages share the name scopes the placement reads. Compile each "
            "pipeline in its own function.")
    return first


def placement_of(run):
    """The PipelinePlacement (pipeline_placement.py) of a program holding the
    pipeline `run`: its stages by op name on run.device_mapping, its
    recomputation mode (a training pipeline under IPUConfig.allow_recompute),
    its schedule over the loop of repeat_count x gradient_accumulation_count
    micro-batches (times its batch serialization iterations, which a
    weight update accumulates too), the weight update's conditional once
    per step."""
    from keras_ipu.device.compiler.options import CONFIGURED
    from keras_ipu.models.options import resolved_recomputation_mode
    from keras_ipu.models.recomputation import allow_recompute
    from keras_ipu.ops.pipeline_placement import PipelinePlacement

    recomputation = CONFIGURED
    if run.training:
        recomputation = (resolved_recomputation_mode(run.recomputation_mode, run.schedule)
                         if allow_recompute() else None)
    serialized = run.batch_serialization_iterations
    micro_batches = run.gradient_accumulation_count * serialized
    return PipelinePlacement.of(
        run.device_mapping, run.schedule, micro_batches,
        training=run.training, recomputation=recomputation, stage_of=pipeline_stage_of,
        once_per_step=(f"{WEIGHT_UPDATE_SCOPE}/cond",),
        loop_micro_batches=run.repeat_count * micro_batches,
        batch_serialization_iterations=serialized)


def _loop_body(graph):
    """The pipeline's loop body in a placed program: the body of the while
    loop whose nodes span the IPUs (one micro-batch per iteration)."""
    from keras_ipu.device.primitives.control_flow import while_p

    for node in graph.nodes:
        if node.primitive is while_p and node.ipu is None:
            return node.params["body_graph"]
        for value in node.params.values():
            for sub in (value if isinstance(value, tuple) else (value,)):
                if hasattr(sub, "nodes"):
                    found = _loop_body(sub)
                    if found is not None:
                        return found
    return None


def _micro_batch_size(body):
    """Samples per micro-batch: the leading size of the first element the
    infeed streams into the body."""
    from keras_ipu.device.primitives.host_transfer import stream_from_host_p

    for node in body.nodes:
        if node.primitive is stream_from_host_p:
            for out in node.outputs:
                shape = getattr(out.aval, "shape", ())
                if shape:
                    return int(shape[0])
    return None


def predict_pipeline(executable, run, target=None):
    """The ShardedPrediction of a compiled pipeline program (see the module
    doc): the one its executable's prediction applies (compiled with the
    run's placement, BridgedFunction.executable), else made now the same
    way."""
    from keras_ipu.device.simulator import memory_model
    from keras_ipu.device.simulator import sharding

    graph = memory_model.graph_of(executable)  # the bodies that run
    body = _loop_body(graph)
    if body is None:
        raise ValueError(
            "The program holds no placed pipeline loop: compile the function that "
            "calls pipelining_ops.pipeline through the IPU (ipu_compiler.compile, "
            "IPUStrategy.run).")
    pipelining = placement_of(run).pipelining
    if target is None and getattr(executable, "pipeline", None) == pipelining:
        pred = executable.prediction.pipeline
    else:
        pred = sharding.predict_sharded(graph, target=target, pipelining=pipelining)
    return dataclasses.replace(pred, batch_size=_micro_batch_size(body))


def check_before_first_run(executable, run):
    """The prediction in the cycle log, and Graphcore's out-of-memory error
    for an IPU that cannot hold its stages."""
    from keras_ipu.device.config import system_config
    from keras_ipu.device.simulator import memory_model

    prediction = predict_pipeline(executable, run)
    if system_config.configuration().flags.log_cycle_count >= 0:
        logging.getLogger("keras_ipu.cycles").info(
            "Predicted functional pipeline:\n%s", prediction)
    for ipu in prediction.ipus:
        if not ipu.memory.fits:
            error = memory_model.IPUOutOfMemoryError(ipu.memory)
            stages = ", ".join(str(s) for s, d in enumerate(run.device_mapping) if d == ipu.ipu)
            error.args = (f"Pipeline stage(s) {stages}: " + error.args[0],)
            raise error
    return prediction
