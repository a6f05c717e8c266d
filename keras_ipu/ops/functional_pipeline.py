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
in the name scope `pipeline_stage_<k>`; the program is simulated on one
IPU (the stages are not placed on the IPUs of `device_mapping`, and the
schedule changes nothing), see the README.

TF1-style variables the stages make (tf.compat.v1.get_variable, the
optimizer's slots and accumulators) are kept across traces in a
VariableStore (keras_ipu/estimators/variable_store.py), the one of the
estimator when the pipeline runs in one.
"""

import weakref

from keras_ipu.gradient_accumulation import GradientAccumulationReductionMethod

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
    from keras_ipu.optimizers.v1 import GradientAccumulationOptimizerV2

    loops._check_context("pipelining_ops.pipeline")  # noqa: SLF001 - the shared check
    stages = list(computational_stages)
    if not stages or not all(callable(s) for s in stages):
        raise ValueError("computational_stages must be a list of callables, got "
                         f"{computational_stages!r}.")
    if gradient_accumulation_count is None:
        raise ValueError("gradient_accumulation_count must be specified.")
    if not isinstance(gradient_accumulation_count, int) or gradient_accumulation_count < 1:
        raise ValueError(
            f"gradient_accumulation_count must be a positive integer, got "
            f"{gradient_accumulation_count!r}.")
    if device_mapping is not None and len(device_mapping) != len(stages):
        raise ValueError(
            "Each stage must be mapped to an IPU: %d mappings != %d stages"
            % (len(device_mapping), len(stages)))
    if continuous_weight_updates:
        raise NotImplementedError(
            "continuous_weight_updates has not been implemented yet (as in Graphcore's SDK).")
    if accumulate_outfeed:
        raise NotImplementedError(
            "accumulate_outfeed is not supported by keras_ipu's functional pipeline.")
    if batch_serialization_iterations != 1:
        raise NotImplementedError(
            "batch_serialization_iterations other than 1 is not supported by keras_ipu's "
            "functional pipeline.")
    if outfeed_loss and outfeed_mask is not None:
        raise ValueError("Only one of `outfeed_loss` and `outfeed_mask` can be set.")
    if outfeed_mask is not None and optimizer_function is None:
        raise ValueError("An `outfeed_mask` can only be specified when `optimizer_function` "
                         "is set.")
    if outfeed_loss and optimizer_function is None:
        raise ValueError("An `optimizer_function` must be specified when `outfeed_loss` "
                         "is set.")
    method = GradientAccumulationReductionMethod.parse(reduction_method)
    fixed = list(inputs or [])
    n = len(stages)

    def body(*element, **named):
        args, kwargs = list(fixed) + list(element), dict(named)
        outputs = None
        for k, stage in enumerate(stages):
            with tf.name_scope(f"pipeline_stage_{k}"):
                outputs = stage(*args, **kwargs)
            args, kwargs = _as_call(outputs)
        ops = []
        to_outfeed = _flat_outputs(outputs)
        if optimizer_function is not None:
            with tf.name_scope("pipeline_weight_update"):
                spec = optimizer_function(*args, **kwargs)
                if not isinstance(spec, OptimizerFunctionOutput):
                    raise TypeError(
                        "The optimizer_function must return a "
                        "pipelining_ops.OptimizerFunctionOutput, got "
                        f"{type(spec).__name__}.")
                opt = GradientAccumulationOptimizerV2(
                    spec.opt, gradient_accumulation_count, dtype=gradient_accumulation_dtype,
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
                        f"outfeed_mask has {len(outfeed_mask)} entries for the "
                        f"{len(leaves)} outputs of the last computational stage.")
                to_outfeed = [x for x, masked in zip(leaves, outfeed_mask) if not masked]
        if not _empty(to_outfeed):
            if outfeed_queue is None:
                raise ValueError(
                    "The last computational stage has tensor outputs: %s, but no "
                    "outfeed_queue has been provided." % (to_outfeed,))
            ops.append(outfeed_queue.enqueue(to_outfeed))
        return tf.group(ops) if ops else tf.no_op()

    total = repeat_count * gradient_accumulation_count
    store = active_store()
    if store is not None:
        return loops.repeat(total, body, [], infeed_queue)
    store = _stores.get(stages[0])
    if store is None:
        store = _stores[stages[0]] = VariableStore()
    with store.trace():
        return loops.repeat(total, body, [], infeed_queue)
