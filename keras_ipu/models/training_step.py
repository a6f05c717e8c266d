"""The train step of a model with gradient accumulation, replication or
pipelining: one optimizer step over `count` micro-batches.

    step(state, micro_batches) -> (logs of each micro-batch, state)

The micro-batches arrive stacked along a leading axis of `count` (the
device loop groups them); a scan runs forward and backward on each with
the weights fixed, accumulating the gradients by the reduction method
(SUM, MEAN, RUNNING_MEAN, keras_ipu/gradient_accumulation.py), in the
accumulator dtype; the metrics (and a BatchNormalization's statistics)
are updated micro-batch by micro-batch. On `replicas` > 1 the accumulated
gradients are all-reduced (mean over the replicas: the cross_replica_mean
primitive, as Graphcore's CrossReplicaOptimizer) before the one weight
update. A pipelined model's step is this one: its pipeline changes when the
micro-batches run on which IPU, never the numbers.
"""

import contextlib

import numpy as np

from keras.src import tree
from keras.src.trainers.data_adapters import data_adapter_utils

from keras_ipu.backend.control_flow import scan
from keras_ipu.device.autodiff import value_and_grad
from keras_ipu.device.primitives import collective
from keras_ipu.device.config import system_config
from keras_ipu.device.trace import default_source
from keras_ipu.gradient_accumulation import GradientAccumulationReductionMethod as Method


# The source path of the gradients' all-reduce (once per optimizer step).
GRADIENT_ALL_REDUCE = "gradient_all_reduce"
# What profiles name the accumulators and the loop over the micro-batches
# (the layers traced in its body keep their names).
GRADIENT_ACCUMULATION = "gradient accumulation"


def _zeros(variable, dtype):
    from keras import ops

    return ops.zeros(variable.shape, dtype or variable.dtype)


def _combine_one(method, count, a, g, n, stages, variable):
    """acc after the n-th micro-batch's gradient (n: a traced float32)."""
    from keras import ops

    with _in_stage(stages, variable):
        g = ops.cast(g, a.dtype)
        if method is Method.SUM:
            return a + g
        if method is Method.MEAN:
            return a + g * (1.0 / count)
        n_a = ops.cast(n, a.dtype)  # RUNNING_MEAN: acc * n / (n + 1) + grad / (n + 1)
        return a * (n_a / (n_a + 1.0)) + g / (n_a + 1.0)


def _in_stage(stages, variable):
    """The pipeline stage scope of a weight's own operations (its gradient's
    accumulation and all-reduce run on the IPU that holds it)."""
    stage = stages.get(id(variable)) if stages else None
    if stage is None:
        return contextlib.nullcontext()
    from keras_ipu.models.staged_graph import stage_scope

    return stage_scope(stage)


def _micro_step(model, count, method, variable_stages):
    """forward and backward of one micro-batch, its gradients combined into
    the accumulators: (trainable, optimizer vars, carry, batch) -> (carry,
    logs), carry = (non-trainable, metrics, accumulators, n)."""
    weights = model.trainable_variables

    def micro_step(trainable, optimizer_variables, carry, batch):
        from keras import ops

        non_trainable, metrics, acc, n = carry
        x, y, sample_weight = data_adapter_utils.unpack_x_y_sample_weight(batch)

        def loss_of(weights):
            return model.compute_loss_and_updates(
                weights, non_trainable, metrics, x, y, sample_weight,
                training=True, optimizer_variables=optimizer_variables,
            )

        (_, aux), grads = value_and_grad(loss_of, has_aux=True)(list(trainable))
        unscaled_loss, y_pred, non_trainable, metrics = aux
        if count == 1:  # nothing to accumulate: the gradients themselves
            acc = [ops.cast(g, a.dtype) for a, g in zip(acc, grads)]
        else:
            acc = [
                _combine_one(method, count, a, g, n, variable_stages, w)
                for a, g, w in zip(acc, grads, weights)
            ]
        logs, metrics = model._update_metrics_variables(
            metrics, unscaled_loss, x, y, y_pred, sample_weight
        )
        return (non_trainable, metrics, acc, n + 1.0), logs

    return micro_step


def _weight_update(model, replicas, variable_stages):
    """The accumulated gradients all-reduced across the replicas, then the
    one optimizer step: (trainable, optimizer vars, accumulators) ->
    (trainable, optimizer vars)."""
    weights = model.trainable_variables

    def update(trainable, optimizer_variables, acc):
        from keras import ops

        grads = [ops.cast(a, v.dtype) for a, v in zip(acc, weights)]
        if replicas > 1 or system_config.configured_instances()[0] > 1:
            from keras import name_scope

            reduced = []
            for g, w in zip(grads, weights):
                # Named, so that predictions count it once per step.
                with _in_stage(variable_stages, w), name_scope(GRADIENT_ALL_REDUCE):
                    reduced.append(collective.cross_replica_mean(g, replicas))
            grads = reduced
        with _updates_in_stages(model.optimizer, variable_stages):
            return model.optimizer.stateless_apply(optimizer_variables, grads, trainable)

    return update


@contextlib.contextmanager
def _updates_in_stages(optimizer, stages):
    """Within: the optimizer's step of each weight runs in the weight's
    pipeline stage, as Graphcore's pipeline updates a weight on the IPU
    holding it. (Left to the placement pass, an update reading only the
    weight's optimizer state, program inputs no placed node reads, would
    follow the node before it: a later stage's update.)"""
    if not stages:
        yield
        return
    step = optimizer.update_step

    def update_step(gradient, variable, learning_rate):
        with _in_stage(stages, variable):
            return step(gradient, variable, learning_rate)

    object.__setattr__(optimizer, "update_step", update_step)
    try:
        yield
    finally:
        object.__delattr__(optimizer, "update_step")


def accumulated_train_step(model, count, method, replicas, accumulator_dtype=None,
                           variable_stages=None):
    """The step described in the module doc, for `model` (an IPUTrainer).
    `variable_stages`: {id(variable): stage} of a pipelined model."""
    method = Method.parse(method)
    micro_step = _micro_step(model, count, method, variable_stages)
    update = _weight_update(model, replicas, variable_stages)

    def step(state, micro_batches):
        from keras import ops

        trainable, non_trainable, optimizer_variables, metrics = state
        with default_source(GRADIENT_ACCUMULATION):
            acc = [_zeros(v, accumulator_dtype) for v in model.trainable_variables]
        carry = (list(non_trainable), list(metrics), acc, np.float32(0.0))
        if count == 1:
            with default_source(GRADIENT_ACCUMULATION):
                carry, logs = micro_step(trainable, optimizer_variables, carry, micro_batches)
            logs = tree.map_structure(lambda v: ops.expand_dims(v, 0), logs)
        else:
            leaves = tree.flatten(micro_batches)
            present = [v is not None for v in leaves]

            def body(carry, arrays):
                it = iter(arrays)
                batch = tree.pack_sequence_as(
                    micro_batches, [next(it) if p else None for p in present]
                )
                return micro_step(trainable, optimizer_variables, carry, batch)

            with default_source(GRADIENT_ACCUMULATION):
                carry, logs = scan(body, carry, [v for v in leaves if v is not None])
        non_trainable, metrics, acc, _ = carry
        trainable, optimizer_variables = update(trainable, optimizer_variables, acc)
        return logs, (trainable, non_trainable, optimizer_variables, metrics)

    step.__name__ = "train_step"
    return step
