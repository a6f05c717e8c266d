"""The train, test and predict functions of an IPU-extended model.

A model with one replica, no gradient accumulation and no pipeline runs
the ipu backend's own functions (backend/trainer.py). Otherwise:

- train: models/training_step.py's step (accumulation over the
  micro-batches of an optimizer step, all-reduce across replicas), run on
  every replica by models/execution.py;
- test / predict: the model's own steps, on every replica;
- a pipelined model's steps run its forward pass stage by stage
  (models/staged_graph.py), with Graphcore's checks of the pipeline
  (stages, device mapping, schedule, iterations).

Logs of several replicas are reduced as set_replication_options says
(NONE: the last replica's; LIST: every replica's; SUM; MEAN).
"""

import logging

import numpy as np

from keras.src import tree

from keras_ipu.backend.trainer import IPUTrainer
from keras_ipu.backend.trainer_ops import model_state
from keras_ipu.backend.trainer_ops.device_loop import concatenate_steps
from keras_ipu.backend.trainer_ops.device_loop import every_step
from keras_ipu.backend.trainer_ops.device_loop import last_step
from keras_ipu.device.compiler import CompileOptions
from keras_ipu.device.compiler.options import CONFIGURED
from keras_ipu.device.ir import ShapedArray
from keras_ipu.device.config import system_config
from keras_ipu.models.execution import ReplicatedExecution
from keras_ipu.models.execution import flatten_micro_batches
from keras_ipu.models.options import ReplicatedMetricReductionMethod as Reduction
from keras_ipu.models.recomputation import training_recomputation
from keras_ipu.models.training_step import accumulated_train_step
from keras_ipu.ops.pipelining_ops import PipelineSchedule

logger = logging.getLogger("keras_ipu")


# -- Graphcore's checks of a pipeline ------------------------------------------
def circular_union(sequence):
    """Offsets at which `sequence` rotated never meets itself rotated by an
    earlier accepted offset (Poplar's schedule of the Interleaved pipeline:
    how many micro-batches are in flight at once)."""
    n = len(sequence)
    accepted = [0]
    for i in range(1, n):
        rotated = sequence[i:] + sequence[:i]
        if all(
            all(a != b for a, b in zip(sequence[k:] + sequence[:k], rotated))
            for k in accepted
        ):
            accepted.append(i)
    return accepted


def overlap_length(schedule, device_mapping, training):
    """Micro-batches in the pipeline at once: its iterations must be a
    multiple of this, and at least this (Poplar's pipeline visitor)."""
    sequence = list(device_mapping)
    if training:
        sequence += list(reversed(device_mapping))
    if schedule == PipelineSchedule.Grouped:
        return len(sequence)
    if schedule == PipelineSchedule.Interleaved:
        return len(circular_union(sequence))
    return 1


def check_pipeline_iterations(iterations, schedule, device_mapping, training):
    overlap = overlap_length(schedule, device_mapping, training)
    context = (
        "This number might be called `gradient_accumulation_count`, "
        "`gradient_accumulation_steps_per_replica` or `steps_per_execution` "
        "depending on the API used."
    )
    if iterations % overlap:
        raise ValueError(
            f"The number of iterations of the pipeline must be a multiple of "
            f"{overlap}, but it is {iterations}. {context}"
        )
    if iterations < overlap:
        raise ValueError(
            f"The number of iterations of the pipeline must be at least {overlap}, "
            f"but it is {iterations}. {context}"
        )


def pipeline_device_mapping(model):
    """The IPU of each stage, checked as Graphcore's pipeline() does."""
    stages = model._ipu_stage_count()
    options = model._ipu_options
    mapping = options.pipelining_device_mapping
    if mapping is None:
        mapping = list(range(stages))
    if stages < 2:
        raise ValueError("Pipeline requires at least two computational stages.")
    if len(mapping) != stages:
        raise ValueError(
            f"Each stage must be mapped to an IPU: {len(mapping)} mappings != "
            f"{stages} stages"
        )
    kwargs = options.pipelining_kwargs
    for name in ("forward_propagation_stages_poplar_options",
                 "backward_propagation_stages_poplar_options"):
        given = kwargs.get(name)
        if given is not None and len(given) != stages:
            raise ValueError(
                f"{name} must be a list or a tuple of PipelineStageOptions objects "
                f"of length {stages} (same number as the number of computational "
                f"stages) but is {len(given)}."
            )
    return mapping


def check_pipeline(model, training):
    """Graphcore's checks of a pipelined model's stages; the IPU of each
    stage."""
    graph = model._ipu_check_assignment(model._ipu_current_assignment())
    graph.check_every_stage_used()
    mapping = pipeline_device_mapping(model)
    schedule = model._ipu_options.pipeline_schedule
    if (schedule == PipelineSchedule.Interleaved and training
            and len(set(mapping)) != len(mapping)):
        raise NotImplementedError(
            "The pipelining schedule 'Interleaved' does not currently support "
            "multiple pipeline stages on the same device for training graphs. "
            "Please use a different pipeline schedule."
        )
    if training:
        _warn_batch_normalization(model)
    return mapping


def pipeline_placement(model, device_mapping, training, count=None, replicas=1):
    """The PipelinePlacement (ops/pipeline_placement.py) of a pipelined
    model's program: each node on the IPU of the stage its layer invocation
    traced in (trace.stage_scope), so the executable's memory and cycles are
    per IPU (exe.memory_by_ipu) and the copies between IPUs are in it; its
    prediction under the model's schedule, `count` micro-batches per step
    (training; inference: the execution's micro-batches), the optimizer
    state it offloads (models/offload.py)."""
    from keras_ipu.models.offload import program_offload
    from keras_ipu.ops.pipeline_placement import PipelinePlacement

    offload = None
    if training:
        offload = program_offload(
            model, model_state.state_variables(model, model_state.TRAIN_STATE), replicas,
            count)
    return PipelinePlacement.of(
        device_mapping, model._ipu_options.pipeline_schedule,
        count if training else None, training=training,
        recomputation=training_recomputation(model) if training else CONFIGURED,
        offload=offload,
        batch_serialization_iterations=(
            model._ipu_options.pipelining_batch_serialization_iterations if training else 1))


def _warn_batch_normalization(model):
    from keras.layers import BatchNormalization

    for layer in model._flatten_layers(include_self=False):
        if isinstance(layer, BatchNormalization) and 0 < layer.momentum < 1:
            logger.warning(
                "The moving statistics for keras.BatchNormalization layers in "
                "pipelined models are not properly updated when training. This "
                "means that during evaluation or inference, these batch "
                "normalization layers will not necessarily normalize their input "
                "data in a way that is consistent with the distribution of the "
                "data they saw when training. (The simulator updates them micro-"
                "batch by micro-batch, as gradient accumulation does.)"
            )
            return


def staged_step(model, step):
    """`step` with the model's forward pass run stage by stage (the ipu
    backend's stateless step, or the TensorFlow front end's loop while
    TensorFlow traces it)."""

    def pipelined_step(*args, **kwargs):
        # The instance's `call` (which stateless_call uses) is the staged
        # one while the step runs; Keras keeps the class's call signature.
        object.__setattr__(model, "call", model._ipu_staged_call)
        try:
            return step(*args, **kwargs)
        finally:
            object.__delattr__(model, "call")

    pipelined_step.__name__ = getattr(step, "__name__", "step")
    return pipelined_step


def _check_pipeline_memory(model, batch):
    """Before a pipelined model first trains: does every IPU hold its
    stages (IPUOutOfMemoryError naming the IPU and stages), and the
    prediction in the cycle log (TF_POPLAR_FLAGS=--log_cycle_count)."""
    from keras_ipu.models.prediction import predict_training

    parts = batch if isinstance(batch, tuple) else (batch,)
    avals = tuple(
        tree.map_structure(lambda v: ShapedArray(np.shape(v), np.asarray(v).dtype), part)
        for part in parts if part is not None
    )
    size = int(np.shape(tree.flatten(parts[0])[0])[0])
    prediction = predict_training(model, size, batch=avals)
    if system_config.configuration().flags.log_cycle_count >= 0:
        logging.getLogger("keras_ipu.cycles").info("Predicted training:\n%s", prediction)
    prediction.check_memory()


# -- logs of several replicas -----------------------------------------------------
def reduce_logs(model, per_replica_logs):
    """One replica's logs as they are; several reduced (set_replication_options)."""
    if len(per_replica_logs) == 1:
        object.__setattr__(model, "_ipu_replicated_logs", None)
        return per_replica_logs[0]
    method = model._ipu_options.replicated_metric_reduction_method

    def reduce(*values):
        values = [np.asarray(v) for v in values]
        if method == Reduction.NONE:
            return values[-1]
        if method == Reduction.LIST:
            return np.stack(values)
        total = np.sum(values, axis=0)
        return total if method == Reduction.SUM else total / len(values)

    logs = tree.map_structure(reduce, *per_replica_logs)
    object.__setattr__(model, "_ipu_replicated_logs", logs)
    return logs


def execution_logs(model, per_replica_chunks, meaned_steps=None, step_logs=None):
    """The logs of one execution, reduced over the replicas: each replica's
    last step's or, with accumulate_outfeed, the mean of its last
    `meaned_steps` steps' (fit: an optimizer step's micro-batches; evaluate:
    all the execution's steps).

    step_logs (asynchronous callbacks): a list that receives each step's
    logs, reduced over the replicas; Graphcore ignores the option with
    accumulate_outfeed (one result per execution), so then it stays empty."""
    if meaned_steps:
        last = [tree.map_structure(
            lambda *xs: None if xs[0] is None else np.concatenate(xs)[-meaned_steps:].mean(axis=0),
            *chunks) for chunks in per_replica_chunks]
    else:
        last = [last_step(chunks) for chunks in per_replica_chunks]
        if step_logs is not None:
            step_logs.extend(reduce_logs(model, list(step))
                             for step in zip(*map(every_step, per_replica_chunks)))
    return reduce_logs(model, last)


# -- the functions --------------------------------------------------------------
def _needs_ipu_functions(model, count):
    # Replicas in other processes (multi_replica_distribution) need the
    # all-reduce of the replicated step even with one replica here; a
    # replica split over a model axis, its split programs (execution.py).
    return (
        model._get_replication_factor() > 1
        or model._ipu_strategy.model_axis_ipus > 1
        or system_config.configured_instances()[0] > 1
        or count > 1
        or model._ipu_is_pipelined()
    )


def gradient_accumulator_dtype(model):
    """The dtype of the gradient accumulators the options ask for (None:
    each variable's own)."""
    options = model._ipu_options
    if model._ipu_is_pipelined():
        dtype = options.pipelining_kwargs.get("gradient_accumulation_dtype")
    else:
        dtype = options.gradient_accumulation_optimizer_kwargs.get("dtype")
    if callable(dtype):
        raise NotImplementedError(
            "A per-variable gradient_accumulation_dtype (a callable) is not "
            "supported: give one dtype for every accumulator, or None for the "
            "variables' own."
        )
    return dtype


def train_function(model):
    count = model._ipu_accumulation_count("fit")
    if not _needs_ipu_functions(model, count):
        return IPUTrainer.make_train_function(model, force=True)
    pipelined = model._ipu_is_pipelined()
    if not model._ipu_step_is_default("train_step"):
        model._ipu_raise_overridden("train_step", pipelined)
    options = model._ipu_options
    replicas = model._get_replication_factor()
    if pipelined:
        mapping = check_pipeline(model, training=True)
        check_pipeline_iterations(count, options.pipeline_schedule, mapping, training=True)
    accumulator_dtype = gradient_accumulator_dtype(model)
    step = accumulated_train_step(
        model, count, options.gradient_accumulation_reduction_method, replicas,
        accumulator_dtype=accumulator_dtype,
        variable_stages=model._ipu_variable_stages() if pipelined else None,
    )
    compile_options = CompileOptions(recomputation=training_recomputation(model))
    if pipelined:
        step = staged_step(model, step)
        compile_options = pipeline_placement(model, mapping, True, count, replicas).options(
            compile_options)
    execution = ReplicatedExecution(
        model, step, model_state.TRAIN_STATE, replicas, micro_batches=count, donate=True,
        options=compile_options,
    )
    accumulate = pipelined and options.pipelining_accumulate_outfeed
    checked = []

    def run_train_execution(batches, step_logs=None):
        if pipelined and not checked:
            _check_pipeline_memory(model, batches[0])
            checked.append(True)
        per_replica = [flatten_micro_batches(chunks) for chunks in execution(batches)]
        return execution_logs(model, per_replica, count if accumulate else None, step_logs)

    run_train_execution.device_loop = execution.device_loop
    run_train_execution.execution = execution
    return run_train_execution


def _inference_execution(model, step_name, kinds):
    replicas = model._get_replication_factor()
    pipelined = model._ipu_is_pipelined()
    step = getattr(model, step_name)
    mapping = None
    options = CompileOptions()
    if pipelined:
        if not model._ipu_step_is_default(step_name):
            model._ipu_raise_overridden(step_name, pipelined=True)
        mapping = check_pipeline(model, training=False)
        step = staged_step(model, step)
        options = pipeline_placement(model, mapping, False).options(options)
    execution = ReplicatedExecution(model, step, kinds, replicas, options=options)
    checked = set()

    def run(batches):
        if mapping is not None:
            iterations = len(batches) // replicas
            if iterations not in checked:
                check_pipeline_iterations(
                    iterations, model._ipu_options.pipeline_schedule, mapping, training=False)
                checked.add(iterations)
        return execution(batches)

    return run, execution


def test_function(model):
    if not _needs_ipu_functions(model, 1):
        return IPUTrainer.make_test_function(model, force=True)
    run, execution = _inference_execution(model, "test_step", model_state.TEST_STATE)
    accumulate = model._ipu_is_pipelined() and model._ipu_options.pipelining_accumulate_outfeed

    def run_test_execution(batches, step_logs=None):
        # With accumulate_outfeed: the mean over the execution's steps (one
        # batch per step on each replica).
        steps = len(batches) // model._get_replication_factor() if accumulate else None
        return execution_logs(model, run(batches), steps, step_logs)

    run_test_execution.device_loop = execution.device_loop
    run_test_execution.execution = execution
    return run_test_execution


def predict_function(model):
    if not _needs_ipu_functions(model, 1):
        return IPUTrainer.make_predict_function(model, force=True)
    run, execution = _inference_execution(model, "predict_step", model_state.PREDICT_STATE)

    def run_predict_execution(batches):
        per_replica = run(batches)
        # Replica r's step t is batch t * replicas + r: interleave them back.
        merged = []
        for runs in zip(*per_replica):
            merged.append(tree.map_structure(
                lambda *xs: None if xs[0] is None else np.stack(xs, axis=1).reshape(
                    (-1,) + xs[0].shape[1:]),
                *runs,
            ))
        return concatenate_steps(merged)

    run_predict_execution.device_loop = execution.device_loop
    run_predict_execution.execution = execution
    return run_predict_execution
