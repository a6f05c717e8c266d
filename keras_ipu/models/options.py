"""The IPU options of one Keras model, as the `set_*_options` extension
methods set them, checked with Graphcore's messages.

`IPUOptions` is plain data (saved in the model's config): gradient
accumulation, pipelining (accumulation count, device mapping, schedule,
recomputation mode, the other `pipeline()` arguments), replication
(metric reduction), asynchronous callbacks, infeed and outfeed options.
"""

import collections.abc
import dataclasses
import enum

from keras_ipu._enum_names import ParsedByName
from keras_ipu.gradient_accumulation import GradientAccumulationReductionMethod
from keras_ipu.ops.pipelining_ops import PipelineSchedule
from keras_ipu.ops.pipelining_ops import PipelineStageOptions
from keras_ipu.ops.pipelining_ops import RecomputationMode


class ReplicatedMetricReductionMethod(
        ParsedByName, enum.Enum,
        parse_error="Cannot parse {value} as a ReplicatedMetricReductionMethod. Valid values "
                    "are: {valid}."):
    """How metrics of several replicas are returned.

    NONE: the values of the last replica. LIST: a list of every replica's
    value (the progress bar shows their mean). SUM: their sum. MEAN: their
    sum scaled by 1 / replicas.
    """

    NONE = 1
    LIST = 2
    SUM = 3
    MEAN = 4


# The arguments of Graphcore's pipelining_ops.pipeline() a Keras model may
# pass through set_pipelining_options(**pipelining_kwargs).
PIPELINE_KWARGS = (
    "gradient_accumulation_dtype", "pipeline_schedule", "recomputation_mode",
    "forward_propagation_stages_poplar_options",
    "backward_propagation_stages_poplar_options", "weight_update_poplar_options",
    "offload_weight_update_variables", "replicated_optimizer_state_sharding",
    "offload_activations", "offload_gradient_accumulation_buffers",
    "replicated_weight_sharding", "offload_weights", "continuous_weight_updates",
    "accumulate_outfeed_dtype", "reduction_method", "name",
    "gradient_accumulation_for_captured_grads",
)
# Arguments set by Keras itself, and arguments Keras cannot take.
_EXPLICIT_PIPELINE_ARGS = {
    "gradient_accumulation_count": "gradient_accumulation_steps_per_replica",
    "device_mapping": "device_mapping",
    "accumulate_outfeed": "accumulate_outfeed",
}
_AUTOMATIC_PIPELINE_ARGS = (
    "computational_stages", "repeat_count", "inputs", "infeed_queue",
    "outfeed_queue", "optimizer_function",
)
_INVALID_PIPELINE_ARGS = ("outfeed_loss", "outfeed_mask", "batch_serialization_iterations")
# The arguments of GradientAccumulationOptimizerV2 the gradient accumulation
# options may pass on.
GRADIENT_ACCUMULATION_KWARGS = (
    "offload_weight_update_variables", "replicated_optimizer_state_sharding",
    "dtype", "reduction_method", "name",
)
# IPUInfeedQueue / IPUOutfeedQueue arguments.
INFEED_KWARGS = ("prefetch_depth", "optimize_dataset")
OUTFEED_KWARGS = ("buffer_depth", "outfeed_all", "io_batch_size", "accumulate_outfeed")


def _positive_int(value):
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(
            "Expected `gradient_accumulation_steps_per_replica` to be a "
            f"positive integer, but got {value} instead."
        )
    return value


# Graphcore's reasons for refusing a key of an options dictionary.
_AUTOMATIC = "This argument is automatically set by Keras."
_INCOMPATIBLE = "This argument is not compatible with Keras."


def _refuse(kwargs, arg, keys, why):
    """Graphcore's refusal of the first of `keys` in the dictionary `kwargs`
    (passed as the argument `arg`), for the reason `why`."""
    for key in keys:
        if key in kwargs:
            raise ValueError(f"Found `{key}` key in `{arg}`. {why}")


def _refuse_normalize_gradients(kwargs, method):
    """SDK 3.x removed `experimental_normalize_gradients` (of the extension
    method `method`); Graphcore's message names its replacement."""
    if "experimental_normalize_gradients" in kwargs:
        raise ValueError(
            f"Found `experimental_normalize_gradients` argument to `{method}`. This "
            "argument has now been removed, use `gradient_accumulation_reduction_method` "
            "instead."
        )


def _check_depth(kwargs, name):
    """A feed's buffer depth (prefetch_depth, buffer_depth): 1 to 255, as the
    IPU's feed buffers allow."""
    depth = kwargs.get(name)
    if depth is not None and (not isinstance(depth, int) or not 0 < depth <= 255):
        raise ValueError(f"{name} must be an integer in [1, 255], got {depth!r}.")


@dataclasses.dataclass
class IPUOptions:
    gradient_accumulation_steps_per_replica: object = None
    gradient_accumulation_reduction_method: object = GradientAccumulationReductionMethod.SUM
    gradient_accumulation_optimizer_kwargs: dict = dataclasses.field(default_factory=dict)
    pipelining_gradient_accumulation_steps_per_replica: object = None
    pipelining_device_mapping: object = None
    pipelining_accumulate_outfeed: object = None
    pipelining_kwargs: dict = dataclasses.field(default_factory=dict)
    # SDK 2.1's PipelineSequential/PipelineModel(batch_serialization_iterations):
    # what the prediction holds at once (the step's micro-batches already
    # count them); not saved, as the pipeline's kwargs are not.
    pipelining_batch_serialization_iterations: int = 1
    replicated_metric_reduction_method: object = ReplicatedMetricReductionMethod.NONE
    asynchronous_callbacks: bool = False
    infeed_kwargs: dict = dataclasses.field(default_factory=dict)
    outfeed_kwargs: dict = dataclasses.field(default_factory=dict)

    # -- setters (the extension methods' checks) ---------------------------
    def set_gradient_accumulation(self, steps, reduction_method, optimizer_kwargs):
        self.gradient_accumulation_reduction_method = (
            GradientAccumulationReductionMethod.parse(reduction_method))
        if steps is not None:
            self.gradient_accumulation_steps_per_replica = _positive_int(steps)
        optimizer_kwargs = dict(optimizer_kwargs or {})
        if optimizer_kwargs:
            if "opt" in optimizer_kwargs:
                raise ValueError(
                    "Found `opt` key in `gradient_accumulation_optimizer_kwargs`. "
                    "This is not supported as the optimizer which the model has "
                    "been compiled with is automatically wrapped."
                )
            if "num_mini_batches" in optimizer_kwargs:
                raise ValueError(
                    "Found `num_mini_batches` key in "
                    "`gradient_accumulation_optimizer_kwargs`. Set the "
                    "`gradient_accumulation_steps_per_replica` argument to "
                    "`set_gradient_accumulation_options` instead."
                )
            _refuse_normalize_gradients(optimizer_kwargs, "set_gradient_accumulation_options")
            unknown = sorted(set(optimizer_kwargs) - set(GRADIENT_ACCUMULATION_KWARGS))
            if unknown:
                raise TypeError(
                    f"__init__() got an unexpected keyword argument '{unknown[0]}' "
                    "(GradientAccumulationOptimizerV2 takes "
                    f"{', '.join(GRADIENT_ACCUMULATION_KWARGS)})."
                )
        self.gradient_accumulation_optimizer_kwargs = optimizer_kwargs

    def set_pipelining(self, steps, device_mapping, accumulate_outfeed,
                       reduction_method, pipelining_kwargs):
        self.gradient_accumulation_reduction_method = (
            GradientAccumulationReductionMethod.parse(reduction_method))
        if steps is not None:
            self.pipelining_gradient_accumulation_steps_per_replica = _positive_int(steps)
        if device_mapping is not None:
            if not isinstance(device_mapping, list) or not all(
                    isinstance(x, int) for x in device_mapping):
                raise ValueError("Expected `device_mapping` to be a list of integers.")
            self.pipelining_device_mapping = list(device_mapping)
        if accumulate_outfeed is not None:
            self.pipelining_accumulate_outfeed = bool(accumulate_outfeed)
        if pipelining_kwargs is None:
            return
        if not isinstance(pipelining_kwargs, collections.abc.Mapping):
            raise TypeError("`pipelining_kwargs` must be a dictionary.")
        if pipelining_kwargs:
            for explicit, alternative in _EXPLICIT_PIPELINE_ARGS.items():
                if explicit in pipelining_kwargs:
                    raise ValueError(
                        f"Found `{explicit}` key in `pipelining_kwargs`. Set the "
                        f"`{alternative}` argument to `set_pipelining_options` instead."
                    )
            _refuse(pipelining_kwargs, "pipelining_kwargs", _AUTOMATIC_PIPELINE_ARGS, _AUTOMATIC)
            _refuse(pipelining_kwargs, "pipelining_kwargs", _INVALID_PIPELINE_ARGS, _INCOMPATIBLE)
            _refuse_normalize_gradients(pipelining_kwargs, "set_pipelining_options")
            unknown = sorted(set(pipelining_kwargs) - set(PIPELINE_KWARGS))
            if unknown:
                raise TypeError(
                    f"pipeline() got an unexpected keyword argument '{unknown[0]}'."
                )
            check_pipeline_kwargs(pipelining_kwargs)
        self.pipelining_kwargs = dict(pipelining_kwargs)

    def set_replication(self, method):
        self.replicated_metric_reduction_method = ReplicatedMetricReductionMethod.parse(method)

    def set_infeed(self, kwargs):
        _refuse(kwargs, "kwargs", ("dataset", "infeed_spec", "element_spec"), _AUTOMATIC)
        _refuse(kwargs, "kwargs", sorted(set(kwargs) - set(INFEED_KWARGS)), _INCOMPATIBLE)
        _check_depth(kwargs, "prefetch_depth")
        self.infeed_kwargs = dict(kwargs)

    def set_outfeed(self, kwargs):
        _refuse(kwargs, "kwargs", ("outfeed_mode", "device_ordinal"), _INCOMPATIBLE)
        _refuse(kwargs, "kwargs", sorted(set(kwargs) - set(OUTFEED_KWARGS)), _INCOMPATIBLE)
        _check_depth(kwargs, "buffer_depth")
        self.outfeed_kwargs = dict(kwargs)

    # -- derived -----------------------------------------------------------
    @property
    def pipeline_schedule(self):
        return self.pipelining_kwargs.get("pipeline_schedule") or PipelineSchedule.Grouped

    @property
    def recomputation_mode(self):
        """The pipeline's recomputation mode (resolved_recomputation_mode)."""
        return resolved_recomputation_mode(
            self.pipelining_kwargs.get("recomputation_mode"), self.pipeline_schedule)

    @property
    def prefetch_depth(self):
        return self.infeed_kwargs.get("prefetch_depth")

    @property
    def buffer_depth(self):
        return self.outfeed_kwargs.get("buffer_depth")

    # -- saving ------------------------------------------------------------
    def get_config(self):
        """What the model's config saves (as Graphcore's: the kwargs dicts
        of the optimizer and the pipeline are not saved)."""
        return {
            "gradient_accumulation_steps_per_replica": self.gradient_accumulation_steps_per_replica,
            "gradient_accumulation_reduction_method": self.gradient_accumulation_reduction_method.value,
            "pipelining_gradient_accumulation_steps_per_replica":
                self.pipelining_gradient_accumulation_steps_per_replica,
            "pipelining_device_mapping": self.pipelining_device_mapping,
            "pipelining_accumulate_outfeed": self.pipelining_accumulate_outfeed,
            "replicated_metric_reduction_method": self.replicated_metric_reduction_method.value,
            "asynchronous_callbacks": self.asynchronous_callbacks,
            "infeed_kwargs": dict(self.infeed_kwargs),
            "outfeed_kwargs": dict(self.outfeed_kwargs),
        }

    @classmethod
    def from_config(cls, config):
        return cls(
            gradient_accumulation_steps_per_replica=config.get("gradient_accumulation_steps_per_replica"),
            gradient_accumulation_reduction_method=GradientAccumulationReductionMethod(
                config.get("gradient_accumulation_reduction_method", 0)),
            pipelining_gradient_accumulation_steps_per_replica=config.get(
                "pipelining_gradient_accumulation_steps_per_replica"),
            pipelining_device_mapping=config.get("pipelining_device_mapping"),
            pipelining_accumulate_outfeed=config.get("pipelining_accumulate_outfeed"),
            replicated_metric_reduction_method=ReplicatedMetricReductionMethod(
                config.get("replicated_metric_reduction_method", 1)),
            asynchronous_callbacks=config.get("asynchronous_callbacks", False),
            infeed_kwargs=dict(config.get("infeed_kwargs") or {}),
            outfeed_kwargs=dict(config.get("outfeed_kwargs") or {}),
        )


def check_pipeline_kwargs(kwargs):
    """pipeline()'s checks of the arguments Keras passes on."""
    schedule = kwargs.get("pipeline_schedule")
    if schedule is not None and not isinstance(schedule, PipelineSchedule):
        raise TypeError(
            "The given pipeline_schedule is not a member of the PipelineSchedule "
            "enumeration."
        )
    mode = kwargs.get("recomputation_mode")
    if mode is not None and not isinstance(mode, RecomputationMode):
        raise TypeError(
            "The given recomputation_mode is not a member of the RecomputationMode "
            "enumeration."
        )
    if kwargs.get("continuous_weight_updates"):
        raise NotImplementedError("Continuous weight updates are currently not supported.")
    for name in ("forward_propagation_stages_poplar_options",
                 "backward_propagation_stages_poplar_options"):
        options = kwargs.get(name)
        if options is None:
            continue
        if not isinstance(options, (list, tuple)):
            raise TypeError(f"{name} must be a list or a tuple of PipelineStageOptions objects.")
        for stage_options in options:
            if not isinstance(stage_options, PipelineStageOptions):
                raise TypeError(
                    f"Expected all elements of {name} to be of type "
                    f"PipelineStageOptions, but got {stage_options} instead."
                )
    update = kwargs.get("weight_update_poplar_options")
    if update is not None and not isinstance(update, PipelineStageOptions):
        raise TypeError(
            "weight_update_poplar_options to be of type PipelineStageOptions, but "
            f"got {update} instead."
        )


def resolved_recomputation_mode(mode, schedule):
    """A pipeline's recomputation mode, Auto (or None) resolved by the
    schedule as Poplar does (Grouped, Interleaved: RecomputeThenBackpropagate;
    Sequential: RecomputeAndBackpropagateInterleaved); NotImplementedError
    with Poplar's message for a mode the schedule does not support."""
    mode = mode or RecomputationMode.Auto
    schedule = PipelineSchedule(schedule)
    sequential = schedule == PipelineSchedule.Sequential
    if mode == RecomputationMode.Auto:
        if sequential:
            return RecomputationMode.RecomputeAndBackpropagateInterleaved
        return RecomputationMode.RecomputeThenBackpropagate
    supported = {
        RecomputationMode.RecomputeThenBackpropagate: not sequential,
        RecomputationMode.RecomputeAndBackpropagateInterleaved:
            schedule != PipelineSchedule.Interleaved,
    }
    if not supported[mode]:
        poplar_name = {
            RecomputationMode.RecomputeThenBackpropagate: "Recompute_then_backpropagate",
            RecomputationMode.RecomputeAndBackpropagateInterleaved:
                "Recompute_and_backpropagate_interleaved",
        }[mode]
        raise NotImplementedError(
            f"Pipeline schedule {schedule.name} does not support "
            f"'{poplar_name}' recomputation mode."
        )
    return mode
