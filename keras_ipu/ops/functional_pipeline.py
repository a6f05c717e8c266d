"""Graphcore's functional pipeline (`pipelining_ops.pipeline`) for TensorFlow
code compiled through the TensorFlow front end.

A pipeline of stages with gradient accumulation count G run `repeat_count`
times computes what this loop computes: for each of the repeat_count * G
micro-batches (infeed elements), the stages one after the other (stage k's
outputs are stage k+1's arguments), then, when training, the gradients of
the optimizer_function's loss are accumulated and applied once every G
micro-batches (GradientAccumulationOptimizerV2 with the pipeline's
reduction method); the last stage's outputs (or the loss) go to the outfeed
per micro-batch. That loop is what this module builds (one `loops.repeat`,
one program): the values are those of the pipeline. Each stage's ops are
in the name scope `pipeline_stage_<k>`; the pipeline records its device
mapping, schedule and recomputation mode for the front end, which places
the stages on their IPUs and simulates the schedule as for a Keras
pipeline (ops/pipeline_simulation.py).

batch_serialization_iterations = b > 1 (Graphcore: Sequential schedule,
every stage on one IPU): Poplar wraps each stage in a loop over b
micro-batches, its inputs and outputs sliced from buffers of b, so one
pipeline iteration reads b infeed elements and a weight update
accumulates G x b micro-batches (SUM). The values are those of that
gradient accumulation, which is what this loop computes; the simulator
holds b micro-batches' stashed activations and stage outputs at once
(sharding.predict_sharded), the time being the Sequential schedule's
over G x b micro-batches.

TF1-style variables the stages make (tf.compat.v1.get_variable, the
optimizer's slots and accumulators) are kept across traces in a
VariableStore (keras_ipu/estimators/variable_store.py), the one of the
estimator when the pipeline runs in one.
"""

import weakref

from keras_ipu.gradient_accumulation import GradientAccumulationReductionMethod
from keras_ipu.ops import loop_state
from keras_ipu.ops.pipeline_runs import PipelineRun
from keras_ipu.ops.pipeline_runs import record_pipeline

# A pipeline's variables outside an estimator: one store per first stage
# function (the variables live as long as the stage does).
_stores = weakref.WeakKeyDictionary()


class OptimizerFunctionOutput:
    """What an optimizer_function returns: the optimizer (a
    tf.compat.v1.train.Optimizer) and the loss, with the extra arguments of
    compute_gradients and apply_gradients."""

    def __init__(self, opt, loss, compute_gradients_args=None, compute_gradients_kwargs=None,
                 apply_gradients_args=None, apply_gradients_kwargs=None):
        self.opt = opt
        self.loss = loss
        self.compute_gradients_args = tuple(compute_gradients_args or ())
        self.compute_gradients_kwargs = dict(compute_gradients_kwargs or {})
        self.apply_gradients_args = tuple(apply_gradients_args or ())
        self.apply_gradients_kwargs = dict(apply_gradients_kwargs or {})


def _as_call(outputs):
    """(args, kwargs) for the next stage from a stage's outputs."""
    if outputs is None:
        return [], {}
    if isinstance(outputs, dict):
        return [], dict(outputs)
    if isinstance(outputs, (list, tuple)):
        return list(outputs), {}
    return [outputs], {}


def _empty(x):
    return x is None or (isinstance(x, (list, tuple, dict)) and len(x) == 0)


def _flat_outputs(outputs):
    args, kwargs = _as_call(outputs)
    return args if not kwargs else kwargs


def run_stages(stages, args, kwargs):
    """The stages one after the other on one micro-batch (stage k's outputs
    are stage k+1's arguments), each under its name scope. Returns the last
    stage's outputs as (args, kwargs) and as returned."""
    import tensorflow as tf

    # The placement reads the stage back from the imported op names.
    from keras_ipu.frontends.tensorflow.stages import stage_scope_name

    outputs = None
    for k, stage in enumerate(stages):
        with tf.name_scope(stage_scope_name(k)):
            outputs = stage(*args, **kwargs)
        args, kwargs = _as_call(outputs)
    return args, kwargs, outputs


def inference_step(stages, fixed, name="pipeline"):
    """One element's trip through an inference pipeline, `fixed` (the
    pipeline's `inputs`) before the element's arguments: what
    serving.export_pipeline compiles."""
    import tensorflow as tf

    def step(*element):
        with tf.name_scope(name):
            _, _, outputs = run_stages(stages, list(fixed) + list(element), {})
        return _flat_outputs(outputs)

    step.__name__ = name
    return step


def _check_stage_options(options, n, what):
    """Graphcore's checks of a list of PipelineStageOptions."""
    from keras_ipu.ops.pipelining_ops import PipelineStageOptions

    if options is None:
        return
    if not isinstance(options, (list, tuple)):
        raise TypeError(f"{what} must be a list or a tuple of PipelineStageOptions objects.")
    if len(options) != n:
        raise ValueError(
            "%s must be a list or a tuple of PipelineStageOptions objects of length %d "
            "(same number as the number of computational stages) but is %d."
            % (what, n, len(options)))
    for stage_options in options:
        if not isinstance(stage_options, PipelineStageOptions):
            raise TypeError(
                "Expected all elements of %s to be of type PipelineStageOptions, but got "
                "%s instead." % (what, stage_options))


def _checked_layout(computational_stages, device_mapping, pipeline_schedule, training,
                    batch_serialization_iterations=1):
    """Graphcore's checks of the stages, their IPUs and the schedule:
    (stages, device mapping, schedule)."""
    from keras_ipu.ops.pipelining_ops import PipelineSchedule

    if pipeline_schedule is None:
        pipeline_schedule = (PipelineSchedule.Sequential if batch_serialization_iterations > 1
                             else PipelineSchedule.Grouped)
    if not isinstance(pipeline_schedule, PipelineSchedule):
        raise TypeError("The given pipeline_schedule is not a member of the "
                        "PipelineSchedule enumeration.")
    if batch_serialization_iterations > 1 and pipeline_schedule != PipelineSchedule.Sequential:
        raise NotImplementedError(
            "Batch serialization is only supported with the `Sequential` schedule.")
    if not isinstance(computational_stages, (list, tuple)):
        raise TypeError("computational_stages argument needs to be a list or a tuple.")
    stages = list(computational_stages)
    if len(stages) < 2:
        raise ValueError("Pipeline requires at least two computational stages.")
    if not all(callable(s) for s in stages):
        raise TypeError(f"computational_stages must be callables, got {stages!r}.")
    if device_mapping is None:
        device_mapping = ([0] * len(stages) if batch_serialization_iterations > 1
                          else list(range(len(stages))))
    if not isinstance(device_mapping, (list, tuple)):
        raise TypeError("device_mapping argument needs to be a list or a tuple.")
    if len(device_mapping) != len(stages):
        raise ValueError(
            "Each stage must be mapped to an IPU: %d mappings != %d stages"
            % (len(device_mapping), len(stages)))
    for ipu in device_mapping:
        if not isinstance(ipu, int) or isinstance(ipu, bool) or ipu < 0:
            raise ValueError(
                f"device_mapping {list(device_mapping)}: {ipu!r} is not an IPU index "
                "(a non-negative integer).")
    if (pipeline_schedule == PipelineSchedule.Interleaved and training
            and len(set(device_mapping)) != len(device_mapping)):
        raise NotImplementedError(
            "The pipelining schedule 'Interleaved' does not currently support multiple "
            "pipeline stages on the same device for training graphs. Please use a "
            "different pipeline schedule.")
    if (pipeline_schedule == PipelineSchedule.Sequential and batch_serialization_iterations > 1
            and len(set(device_mapping)) != 1):
        raise NotImplementedError(
            "When using batch serialization, all the pipeline stages need to be mapped "
            "to a single IPU.")
    return stages, tuple(device_mapping), pipeline_schedule


def check_inference_pipeline(computational_stages, iterations, device_mapping=None,
                             pipeline_schedule=None, poplar_options=None):
    """The stages of an inference pipeline of `iterations` micro-batches,
    checked as Graphcore's pipeline and Poplar's pipeline lowering check
    them (serving.export_pipeline)."""
    from keras_ipu.models.functions import check_pipeline_iterations

    stages, mapping, schedule = _checked_layout(computational_stages, device_mapping,
                                                pipeline_schedule, training=False)
    _check_stage_options(poplar_options, len(stages), "forward_propagation_stages_poplar_options")
    check_pipeline_iterations(iterations, schedule, mapping, training=False)
    return stages


def pipeline(computational_stages, gradient_accumulation_count=None,
             gradient_accumulation_dtype=None, repeat_count=1, batch_serialization_iterations=1,
             inputs=None, infeed_queue=None, outfeed_queue=None, optimizer_function=None,
             device_mapping=None, pipeline_schedule=None, recomputation_mode=None,
             forward_propagation_stages_poplar_options=None,
             backward_propagation_stages_poplar_options=None, weight_update_poplar_options=None,
             offload_weight_update_variables=None, replicated_optimizer_state_sharding=False,
             offload_activations=None, offload_gradient_accumulation_buffers=None,
             replicated_weight_sharding=None, offload_weights=None,
             continuous_weight_updates=False, outfeed_loss=False, accumulate_outfeed=False,
             accumulate_outfeed_dtype=None, outfeed_mask=None,
             reduction_method=GradientAccumulationReductionMethod.SUM, name=None):
    """Sets up a series of computational stages, where the outputs of one
    stage are the inputs to the next one (see the module doc and Graphcore's
    documentation). Returns the Operation that runs the pipeline."""
    import tensorflow as tf

    from keras_ipu import loops
    from keras_ipu.estimators.variable_store import VariableStore
    from keras_ipu.estimators.variable_store import active_store
    from keras_ipu.ipu_outfeed_queue import IPUOutfeedMode
    from keras_ipu.models.functions import check_pipeline_iterations
    from keras_ipu.ops.pipelining_ops import PipelineStageOptions
    from keras_ipu.ops.pipelining_ops import RecomputationMode
    from keras_ipu.optimizers.v1 import GradientAccumulationOptimizerV2

    loops._check_context("pipelining_ops.pipeline")  # noqa: SLF001 - the shared check
    if gradient_accumulation_count is None:
        raise ValueError("gradient_accumulation_count must be specified.")
    if (not isinstance(gradient_accumulation_count, int)
            or isinstance(gradient_accumulation_count, bool) or gradient_accumulation_count < 1):
        raise ValueError(
            f"gradient_accumulation_count must be a positive integer, got "
            f"{gradient_accumulation_count!r}.")
    training = optimizer_function is not None
    method = GradientAccumulationReductionMethod.parse(reduction_method)
    if method != GradientAccumulationReductionMethod.SUM and batch_serialization_iterations != 1:
        raise ValueError("batch_serialization_iterations != 1 is only supported when "
                         "reduction_method is GradientAccumulationReductionMethod.SUM")
    if continuous_weight_updates:
        raise NotImplementedError("Continuous weight updates are currently not supported.")
    stages, mapping, schedule = _checked_layout(
        computational_stages, device_mapping, pipeline_schedule, training,
        batch_serialization_iterations)
    if recomputation_mode is None:
        recomputation_mode = RecomputationMode.Auto
    if not isinstance(recomputation_mode, RecomputationMode):
        raise TypeError("The given recomputation_mode is not a member of the "
                        "RecomputationMode enumeration.")
    _check_stage_options(forward_propagation_stages_poplar_options, len(stages),
                         "forward_propagation_stages_poplar_options")
    if training:
        _check_stage_options(backward_propagation_stages_poplar_options, len(stages),
                             "backward_propagation_stages_poplar_options")
        if (weight_update_poplar_options is not None
                and not isinstance(weight_update_poplar_options, PipelineStageOptions)):
            raise TypeError(
                "weight_update_poplar_options to be of type PipelineStageOptions, but got "
                "%s instead." % (weight_update_poplar_options,))
    if outfeed_mask and not training:
        raise ValueError("An optimizer_function must be provided when outfeed_mask is set.")
    if outfeed_loss and not training:
        raise ValueError("An optimizer_function must be provided when outfeed_loss is True.")
    if outfeed_loss and outfeed_mask:
        raise ValueError("Only one of `outfeed_loss` and `outfeed_mask` can be set.")
    if accumulate_outfeed:
        if not outfeed_queue:
            raise ValueError(
                "An outfeed_queue must be provided when accumulate_outfeed is True.")
        if outfeed_queue._outfeed_mode != IPUOutfeedMode.ALL:  # noqa: SLF001 - as Graphcore's
            raise ValueError("To accumulate the outfeed, it must be in IPUOutfeedMode ALL.")
    if (not isinstance(batch_serialization_iterations, int)
            or isinstance(batch_serialization_iterations, bool)
            or batch_serialization_iterations < 1):
        raise ValueError(
            f"batch_serialization_iterations must be a positive integer, got "
            f"{batch_serialization_iterations!r}.")
    check_pipeline_iterations(gradient_accumulation_count, schedule, mapping, training)
    # Batch serialization (Poplar's PipelineBatchSerializationLoopInserter):
    # each stage runs in a loop over batch_serialization_iterations
    # micro-batches, so a weight update accumulates count x iterations of
    # them (Graphcore's tests compare with that many on the CPU).
    micro_batches = gradient_accumulation_count * batch_serialization_iterations
    fixed = list(inputs or [])
    name = name or "pipeline"

    def enqueue_or_accumulate(data):
        if not accumulate_outfeed:
            return outfeed_queue.enqueue(data)
        return _accumulated_enqueue(outfeed_queue, data, micro_batches,
                                    accumulate_outfeed_dtype, name)

    def body(*element, **named):
        # get_current_iteration_counter in a stage: the micro-batch's
        # gradient accumulation iteration (this loop runs repeat_count x G).
        with loop_state.pipeline_iterations(gradient_accumulation_count):
            args, kwargs, outputs = run_stages(stages, list(fixed) + list(element),
                                               dict(named))
        ops = []
        to_outfeed = _flat_outputs(outputs)
        if training:
            with tf.name_scope("pipeline_weight_update"):
                spec = optimizer_function(*args, **kwargs)
                if not isinstance(spec, OptimizerFunctionOutput):
                    raise TypeError(
                        "The optimizer_function must return a "
                        "pipelining_ops.OptimizerFunctionOutput, got "
                        f"{type(spec).__name__}.")
                opt = GradientAccumulationOptimizerV2(
                    spec.opt, micro_batches, dtype=gradient_accumulation_dtype,
                    reduction_method=method, name="PipelineGradientAccumulation")
                grads = opt.compute_gradients(spec.loss, *spec.compute_gradients_args,
                                              **spec.compute_gradients_kwargs)
                ops.append(opt.apply_gradients(grads, *spec.apply_gradients_args,
                                               **spec.apply_gradients_kwargs))
            if outfeed_loss:
                to_outfeed = spec.loss
            elif outfeed_mask is not None:
                leaves = list(to_outfeed) if isinstance(to_outfeed, list) else [to_outfeed]
                if len(outfeed_mask) != len(leaves):
                    raise ValueError(
                        "The last computational stage has %d outputs, but the "
                        "`outfeed_mask` has elements %d - these need to match in size."
                        % (len(leaves), len(outfeed_mask)))
                to_outfeed = [x for x, masked in zip(leaves, outfeed_mask) if not masked]
        if not _empty(to_outfeed):
            if outfeed_queue is None:
                raise ValueError(
                    "The last computational stage has tensor outputs: %s, but no "
                    "outfeed_queue has been provided." % (to_outfeed,))
            ops.append(enqueue_or_accumulate(to_outfeed))
        return tf.group(ops) if ops else tf.no_op()

    total = repeat_count * micro_batches
    record_pipeline(PipelineRun(
        device_mapping=mapping, schedule=schedule,
        gradient_accumulation_count=gradient_accumulation_count, repeat_count=repeat_count,
        recomputation_mode=recomputation_mode, training=training,
        batch_serialization_iterations=batch_serialization_iterations))
    store = active_store()
    if store is not None:
        return loops.repeat(total, body, [], infeed_queue)
    store = _stores.get(stages[0])
    if store is None:
        store = _stores[stages[0]] = VariableStore()
    with store.trace():
        return loops.repeat(total, body, [], infeed_queue)


def _accumulated_enqueue(outfeed_queue, data, count, dtype, name):
    """accumulate_outfeed: each leaf summed over the pipeline run's `count`
    micro-batches in an accumulator (of `dtype`, or the leaf's own) and
    enqueued once, after the last, as Graphcore's pipeline sinks it in the
    weight update."""
    import tensorflow as tf

    leaves = tf.nest.flatten(data)
    with tf.compat.v1.variable_scope(f"{name}_outfeed_accumulation",
                                     reuse=tf.compat.v1.AUTO_REUSE):
        counter = tf.compat.v1.get_variable(
            "micro_batch", shape=(), dtype=tf.int32, trainable=False,
            initializer=tf.compat.v1.zeros_initializer())
        accumulators = []
        for k, leaf in enumerate(leaves):
            leaf = tf.convert_to_tensor(leaf)
            acc_dtype = leaf.dtype
            if dtype is not None:
                acc_dtype = tf.as_dtype(dtype(leaf) if callable(dtype)
                                        and not isinstance(dtype, tf.DType) else dtype)
            accumulators.append(tf.compat.v1.get_variable(
                f"accumulator_{k}", shape=leaf.shape, dtype=acc_dtype, trainable=False,
                initializer=tf.compat.v1.zeros_initializer()))
    from keras_ipu.optimizers.v1 import every_nth

    sums = [acc + tf.cast(leaf, acc.dtype) for acc, leaf in zip(accumulators, leaves)]
    return every_nth(counter, count, accumulators, sums,
                     lambda values: outfeed_queue.enqueue(tf.nest.pack_sequence_as(data, values)))
