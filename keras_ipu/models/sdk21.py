"""The SDK 2.1 Keras classes: `ipu.keras.Model`, `Sequential`,
`PipelineModel`, `PipelineSequential`.

They are the later extension methods (models/extension.py) fixed at
construction: gradient accumulation (and a pipeline's stages, device
mapping, schedule, ...) are constructor arguments, and fit / evaluate /
predict count in *steps* of `gradient_accumulation_count` mini-batches,
with `steps_per_run` (steps per replica in one execution on the device)
and `prefetch_depth`, as SDK 2.1 did:

- `steps_per_epoch` (all replicas together) must divide by
  `steps_per_run x replication factor` (by the replication factor without
  `steps_per_run`);
- without it, the data gives the steps: mini-batches // (accumulation x
  replicas [x steps_per_run]), the rest dropped with a warning;
- a partial last batch of array data is dropped (SDK 2.1 batched with
  drop_remainder=True);
- the models cannot be called directly (only through fit, evaluate and
  predict), nor saved with `save`; arguments SDK 2.1 did not take raise.

Each maps onto the extension machinery: one execution runs
`steps_per_run x gradient_accumulation_count` mini-batches per replica
(the later API's steps_per_execution).
"""

import contextlib
import logging
import warnings

import numpy as np

from keras.src import tree
from keras.src.layers.layer import Layer
from keras.src.models.functional import Functional
from keras.src.models.sequential import Sequential as KerasSequential

from keras_ipu.distribute import scope as _scope
from keras_ipu.models.extension import FunctionalExtension
from keras_ipu.models.extension import SequentialExtension

logger = logging.getLogger("keras_ipu")

_UNSUPPORTED = (
    "sample_weight_mode", "weighted_metrics", "target_tensors", "distribute",
    "run_eagerly", "validation_split", "validation_data", "class_weight",
    "sample_weight", "validation_steps", "validation_freq", "max_queue_size",
    "workers", "use_multiprocessing",
)


def _validate_args(kwargs, fn):
    if "y" in kwargs:
        raise ValueError("Labels should be provided by the 'x' DataSet containing a tuple.")
    if "batch_size" in kwargs:
        raise ValueError(
            "Do not specify `batch_size` in IPU Keras models. Use the "
            "Dataset.batch() method to apply batching at the input dataset level."
        )
    bad = [a for a in _UNSUPPORTED if a in kwargs]
    if bad:
        raise NotImplementedError(
            f"IPU Keras models do not support these parameters to {fn}(): " + ", ".join(bad)
        )
    if kwargs:
        raise TypeError(f"{fn}() got an unexpected keyword argument '{next(iter(kwargs))}'")


def _renamed(old, new, old_name, new_name, default, owner):
    if old != default:
        logger.warning("From %s: Argument '%s' is deprecated, use '%s' instead.",
                       owner, old_name, new_name)
        if new != default:
            raise ValueError(f"Arguments {old_name} and {new_name} cannot be used together.")
        return old
    return new


def _is_dataset(x):
    return type(x).__module__.startswith("tensorflow") and hasattr(x, "element_spec")


def _array_batches(x, batch_size):
    """Mini-batches of array data (the partial last one dropped)."""
    first = tree.flatten(x)[0]
    return len(first) // batch_size


def _trim(data, samples):
    return tree.map_structure(lambda v: None if v is None else v[:samples], data)


class _SDK21Model:
    """fit / evaluate / predict in steps of gradient_accumulation_count
    mini-batches (see the module doc)."""

    _sdk21_in_loop = False

    def _sdk21_init(self, gradient_accumulation_count):
        if not isinstance(gradient_accumulation_count, int) or gradient_accumulation_count < 1:
            raise ValueError(
                "gradient_accumulation_count must be a positive integer, got "
                f"{gradient_accumulation_count!r}."
            )
        self._ipu_extension_init(_scope.current_strategy())
        object.__setattr__(self, "gradient_accumulation_count", gradient_accumulation_count)

    # -- what SDK 2.1 refused ------------------------------------------------
    def __call__(self, *args, **kwargs):
        if not self._sdk21_in_loop:
            raise ValueError(
                f"{type(self).__name__} can only be called through the `fit`, "
                "`evaluate` or `predict` interfaces."
            )
        return super().__call__(*args, **kwargs)

    def save(self, *args, **kwargs):
        """IPU Keras models do not support the `save` interface."""
        raise NotImplementedError("IPU Keras models do not support the `save` interface.")

    def compile(self, optimizer="rmsprop", loss=None, metrics=None, loss_weights=None, **kwargs):
        if not isinstance(loss_weights, (list, type(None))):
            raise ValueError("loss_weights can only be specified as a list.")
        _validate_args(kwargs, "compile")
        return super().compile(optimizer=optimizer, loss=loss, metrics=metrics,
                               loss_weights=loss_weights)

    @property
    def replication_factor(self):
        if self._ipu_strategy is None:
            raise ValueError(f"{type(self).__name__} can only be used on an IPU device.")
        return self._get_replication_factor()

    @contextlib.contextmanager
    def _sdk21_loop(self):
        previous = self._sdk21_in_loop
        object.__setattr__(self, "_sdk21_in_loop", True)
        try:
            with self._ipu_strategy.scope():
                yield
        finally:
            object.__setattr__(self, "_sdk21_in_loop", previous)

    def _sdk21_plan(self, mode, x, batch_size, steps, steps_per_run):
        """(mini-batches per execution and replica, total mini-batches of
        the epoch or None to let the data say, the data trimmed), with SDK
        2.1's checks and messages."""
        count = self.gradient_accumulation_count
        replicas = self.replication_factor
        name = type(self).__name__
        train = mode == "fit"
        steps_name = ("number of steps in an epoch 'steps_per_epoch'" if train
                      else "number of steps 'steps'")
        loop = "training" if train else ("inference" if mode == "predict" else "evaluation")
        size = None
        if not _is_dataset(x):
            size = _array_batches(x, batch_size or 32)
        if steps is not None:
            if steps_per_run is not None and steps % (steps_per_run * replicas):
                raise ValueError(
                    f"{name} requires the {steps_name} ({steps}) to be evenly divisible "
                    "by the number of steps per execution of the on-device "
                    f"{loop} loop 'steps_per_run' ({steps_per_run}) multiplied by the "
                    f"replication factor ({replicas})."
                )
            if steps_per_run is None and steps % replicas:
                raise ValueError(
                    f"{name} requires the {steps_name} ({steps}) to be evenly divisible "
                    f"by the replication factor ({replicas})."
                )
            if size is not None and steps * count > size:
                label = "Steps per epoch" if train else "Steps"
                raise ValueError(
                    f"{label} times gradient accumulation count ({steps} x {count}) is "
                    f"greater than the number of mini-batches in the dataset ({size})."
                )
            per_replica = steps // replicas
        elif size is None:
            raise ValueError(
                "When using an infinitely repeating dataset, you must provide the "
                "number of steps per epoch (steps_per_epoch)."
            )
        else:
            unit = count * replicas * (steps_per_run or 1)
            if size // unit == 0:
                extra = (f" multiplied by steps_per_run ({steps_per_run})"
                         if steps_per_run else "")
                raise ValueError(
                    f"The number of mini-batches in the dataset ({size}) must be at "
                    f"least the gradient accumulation count ({count}) multiplied by "
                    f"the replication factor ({replicas}){extra}."
                )
            if size % unit:
                kept = size // unit * unit
                extra = (f" multiplied by steps_per_run ({steps_per_run})"
                         if steps_per_run else "")
                what = "steps per epoch (steps_per_epoch)" if train else "steps"
                logger.warning(
                    " The number of mini-batches in the dataset (%d) must be a multiple "
                    "of the gradient accumulation count (%d) multiplied by the "
                    "replication factor (%d)%s. Samples have been dropped to give a "
                    "dataset of %d mini-batches. Adjust the size of the supplied "
                    "dataset or specify the %s if you do not want this to happen.",
                    size, count, replicas, extra, kept, what,
                )
            per_replica = size // unit * (steps_per_run or 1)
        steps_per_run = steps_per_run or per_replica
        per_execution = steps_per_run * count
        total = per_replica * replicas * count
        return per_execution, total

    @contextlib.contextmanager
    def _sdk21_run(self, mode, x, y, batch_size, steps, steps_per_run, prefetch_depth, kwargs):
        if batch_size and _is_dataset(x):
            raise ValueError(
                f"Do not specify `batch_size` in {type(self).__name__}.{mode}(). Use "
                "the Dataset.batch() method to apply batching at the input dataset level."
            )
        _validate_args(kwargs, mode)
        if self._ipu_strategy is None:
            raise ValueError(f"{type(self).__name__} can only be used on an IPU device.")
        if prefetch_depth is not None:
            self.set_infeed_queue_options(prefetch_depth=prefetch_depth)
        per_execution, total = self._sdk21_plan(mode, x, batch_size, steps, steps_per_run)
        batches = {}
        if _is_dataset(x):
            batches["steps"] = total
        else:
            batch_size = batch_size or 32
            x, y = _trim(x, total * batch_size), _trim(y, total * batch_size)
            batches["batch_size"] = batch_size
        previous = self.steps_per_execution
        self.steps_per_execution = per_execution
        try:
            with self._sdk21_loop():
                yield x, y, batches
        finally:
            self.steps_per_execution = previous

    def fit(self, x=None, y=None, *, batch_size=None, epochs=1, verbose=1, callbacks=None,
            shuffle=True, initial_epoch=0, steps_per_epoch=None, steps_per_run=None,
            prefetch_depth=None, **kwargs):
        with self._sdk21_run("fit", x, y, batch_size, steps_per_epoch, steps_per_run,
                             prefetch_depth, kwargs) as (x, y, batches):
            steps = batches.pop("steps", None)
            return super().fit(x, y, epochs=epochs, verbose=verbose, callbacks=callbacks,
                               shuffle=False, initial_epoch=initial_epoch,
                               steps_per_epoch=steps, **batches)

    def evaluate(self, x=None, y=None, batch_size=None, verbose=1, steps=None, callbacks=None,
                 steps_per_run=None, prefetch_depth=None, **kwargs):
        with self._sdk21_run("evaluate", x, y, batch_size, steps, steps_per_run,
                             prefetch_depth, kwargs) as (x, y, batches):
            return super().evaluate(x, y, verbose=verbose, callbacks=callbacks, **batches)

    def predict(self, x, batch_size=None, verbose=0, steps=None, callbacks=None,
                steps_per_run=None, prefetch_depth=None, **kwargs):
        with self._sdk21_run("predict", x, None, batch_size, steps, steps_per_run,
                             prefetch_depth, kwargs) as (x, _, batches):
            return super().predict(x, verbose=verbose, callbacks=callbacks, **batches)


def _check_layers(layers, what):
    if not isinstance(layers, list):
        raise ValueError(f"IPU {what} requires a list of Layers.")
    for layer in layers:
        if not isinstance(layer, Layer):
            raise ValueError(f"An IPU {what}'s list of Layers may only contain Keras Layers.")


class Sequential(_SDK21Model, SequentialExtension, KerasSequential):
    """A Keras Sequential model for one IPU (per replica) with gradient
    accumulation and an on-device training loop (SDK 2.1)."""

    def __init__(self, layers=None, gradient_accumulation_count=1,
                 gradient_accumulation_dtype=None, layer_replacement=False,
                 accumulation_count=1, accumulation_dtype=None):
        del layer_replacement
        count = _renamed(accumulation_count, gradient_accumulation_count,
                         "accumulation_count", "gradient_accumulation_count", 1, "Sequential")
        dtype = _renamed(accumulation_dtype, gradient_accumulation_dtype,
                         "accumulation_dtype", "gradient_accumulation_dtype", None, "Sequential")
        _check_layers(layers, "Sequential")
        KerasSequential.__init__(self, layers)
        self._sdk21_init(count)
        self._ipu_options.set_gradient_accumulation(
            count, "sum", {"dtype": dtype} if dtype is not None else {})


class Model(_SDK21Model, FunctionalExtension, Functional):
    """A Keras (Functional) model for one IPU (per replica) with gradient
    accumulation and an on-device training loop (SDK 2.1)."""

    def __init__(self, *args, gradient_accumulation_count=1, gradient_accumulation_dtype=None,
                 layer_replacement=False, accumulation_count=1, accumulation_dtype=None,
                 **kwargs):
        del layer_replacement
        count = _renamed(accumulation_count, gradient_accumulation_count,
                         "accumulation_count", "gradient_accumulation_count", 1, "Model")
        dtype = _renamed(accumulation_dtype, gradient_accumulation_dtype,
                         "accumulation_dtype", "gradient_accumulation_dtype", None, "Model")
        if len(args) != 2 - sum(["inputs" in kwargs, "outputs" in kwargs]):
            raise ValueError("Model was not provided with 'inputs' and 'outputs'")
        Functional.__init__(self, *args, **kwargs)
        self._sdk21_init(count)
        self._ipu_options.set_gradient_accumulation(
            count, "sum", {"dtype": dtype} if dtype is not None else {})


def _pipeline_options(model, count, dtype, batch_serialization_iterations, device_mapping,
                      pipeline_schedule, recomputation_mode, extra):
    from keras_ipu.ops.pipelining_ops import PipelineSchedule

    if batch_serialization_iterations != 1:
        schedule = pipeline_schedule
        if schedule != PipelineSchedule.Sequential:
            raise NotImplementedError(
                "Batch serialization is only supported with the `Sequential` schedule.")
        # As pipelining_ops.pipeline: every stage on IPU 0 by default, and
        # on one IPU in any case (each stage loops over the slices there).
        if device_mapping is None:
            device_mapping = [0] * len(model.stages)
        if len(set(device_mapping)) != 1:
            raise NotImplementedError(
                "When using batch serialization, all the pipeline stages need to be "
                "mapped to a single IPU.")
        model._ipu_options.pipelining_batch_serialization_iterations = (
            batch_serialization_iterations)
    kwargs = {k: v for k, v in extra.items() if v is not None and v is not False}
    if dtype is not None:
        kwargs["gradient_accumulation_dtype"] = dtype
    if pipeline_schedule is not None:
        kwargs["pipeline_schedule"] = pipeline_schedule
    if recomputation_mode is not None:
        kwargs["recomputation_mode"] = recomputation_mode
    # SDK 2.1: a step is count x batch_serialization_iterations mini-batches.
    micro_batches = count * batch_serialization_iterations
    model.set_pipelining_options(
        gradient_accumulation_steps_per_replica=micro_batches,
        device_mapping=list(device_mapping) if device_mapping is not None else None,
        **kwargs,
    )
    object.__setattr__(model, "gradient_accumulation_count", micro_batches)


_PIPELINE_EXTRA = (
    "forward_propagation_stages_poplar_options", "backward_propagation_stages_poplar_options",
    "weight_update_poplar_options", "offload_weight_update_variables",
    "replicated_optimizer_state_sharding", "offload_activations",
    "offload_gradient_accumulation_buffers", "replicated_weight_sharding", "offload_weights",
)


class PipelineSequential(_SDK21Model, SequentialExtension, KerasSequential):
    """A pipelined Sequential model: `stages` is a list of lists of layers,
    one list per pipeline stage (SDK 2.1)."""

    def __init__(self, stages, gradient_accumulation_count, gradient_accumulation_dtype=None,
                 batch_serialization_iterations=1, device_mapping=None, pipeline_schedule=None,
                 recomputation_mode=None, forward_propagation_stages_poplar_options=None,
                 backward_propagation_stages_poplar_options=None,
                 weight_update_poplar_options=None, offload_weight_update_variables=None,
                 replicated_optimizer_state_sharding=False, offload_activations=None,
                 offload_gradient_accumulation_buffers=None, replicated_weight_sharding=None,
                 offload_weights=None, layer_replacement=False, **kwargs):
        del layer_replacement
        if not isinstance(stages, list) or not stages:
            raise ValueError("An IPU pipeline must take a non-empty list of stages, where "
                             "each stage is a list of Keras Layers.")
        for stage in stages:
            if not isinstance(stage, list):
                raise ValueError("An IPU pipeline may only contain lists of stages, where "
                                 "each stage is a list of Keras Layers.")
            for layer in stage:
                if not isinstance(layer, Layer):
                    raise ValueError("Each list in the `stages` list must contain only "
                                     "Keras Layers.")
        layers = []
        for index, stage in enumerate(stages):
            for layer in stage:
                object.__setattr__(layer, "_pipeline_stage", index)
                layers.append(layer)
        KerasSequential.__init__(self, layers, name=kwargs.pop("name", None))
        self._sdk21_init(gradient_accumulation_count)
        object.__setattr__(self, "stages", stages)
        local = locals()
        _pipeline_options(self, gradient_accumulation_count, gradient_accumulation_dtype,
                          batch_serialization_iterations, device_mapping, pipeline_schedule,
                          recomputation_mode, {k: local[k] for k in _PIPELINE_EXTRA})


class PipelineModel(_SDK21Model, FunctionalExtension, Functional):
    """A pipelined Functional model whose layers got their stages from
    PipelineStage contexts (SDK 2.1)."""

    def __init__(self, *args, gradient_accumulation_count, gradient_accumulation_dtype=None,
                 batch_serialization_iterations=1, device_mapping=None, pipeline_schedule=None,
                 recomputation_mode=None, forward_propagation_stages_poplar_options=None,
                 backward_propagation_stages_poplar_options=None,
                 weight_update_poplar_options=None, offload_weight_update_variables=None,
                 replicated_optimizer_state_sharding=False, offload_activations=None,
                 offload_gradient_accumulation_buffers=None, replicated_weight_sharding=None,
                 offload_weights=None, layer_replacement=False, **kwargs):
        del layer_replacement
        Functional.__init__(self, *args, **kwargs)
        self._sdk21_init(gradient_accumulation_count)
        if not self._ipu_is_pipelined():
            raise ValueError(
                "All layers of a pipelined model must have an associated pipeline stage: "
                "construct or call them inside `ipu.keras.PipelineStage(n)` contexts."
            )
        object.__setattr__(self, "stages", list(range(self._ipu_stage_count())))
        local = locals()
        _pipeline_options(self, gradient_accumulation_count, gradient_accumulation_dtype,
                          batch_serialization_iterations, device_mapping, pipeline_schedule,
                          recomputation_mode, {k: local[k] for k in _PIPELINE_EXTRA})


def _deprecated_sequential_pipeline_model(*args, **kwargs):
    warnings.warn("SequentialPipelineModel is deprecated, use PipelineSequential.",
                  DeprecationWarning, stacklevel=2)
    return PipelineSequential(*args, **kwargs)


SequentialPipelineModel = _deprecated_sequential_pipeline_model
