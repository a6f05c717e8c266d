"""The IPU extensions of a Keras model made in an IPUStrategy scope.

As Graphcore's IPUStrategy does (keras_extensions.py of its TensorFlow),
the model's class is swapped for a subclass of it with the extension
methods mixed in (same name and module, so Keras saves it as the class it
was); a model made outside any scope keeps its class.

The extension methods (Graphcore's SDK 2.2+ API):
  set_gradient_accumulation_options, set_pipelining_options,
  set_replication_options, set_asynchronous_callbacks,
  set_infeed_queue_options, set_outfeed_queue_options,
  get/set/reset_pipeline_stage_assignment,
  print_pipeline_stage_assignment_summary, export_for_ipu_serving.

What they change when the model trains (fit/evaluate/predict):
- the shard count (highest pipeline stage, or device_mapping entry, + 1,
  rounded up to a power of two) and the replication factor (IPUs of the
  strategy's device / shards), with Graphcore's message when they do not fit;
- the data (models/data.py: steps per replica, divisibility rules);
- the train step (models/training_step.py: gradient accumulation over
  micro-batches, all-reduce across replicas) and its execution on every
  replica (models/execution.py);
- a pipelined model's forward pass runs its layers stage by stage
  (models/staged_graph.py): the values of gradient accumulation over its
  micro-batches, each traced node tagged with its stage.
"""

import json
import logging
import os

import numpy as np

from keras.src import tree

from keras_ipu import _atomic_files
from keras_ipu.device.simulator.system import rounded_shards
from keras_ipu.models import stage_assignment as sa
from keras_ipu.models.options import IPUOptions
from keras_ipu.models.staged_graph import StagedGraph
from keras_ipu.models.staged_graph import post_order
from keras_ipu.models.staged_graph import node_index
from keras_ipu.models.staged_graph import sequential_stages

logger = logging.getLogger("keras_ipu")

_MODES = ("fit", "evaluate", "predict")


def _set(model, name, value):
    # Plain attributes: Keras' tracking must not wrap or track them.
    object.__setattr__(model, name, value)


class KerasExtension:
    """The methods every IPU-extended model has (see the module doc)."""

    # -- set up -----------------------------------------------------------
    def _ipu_extension_init(self, strategy):
        _set(self, "_ipu_strategy", strategy)
        _set(self, "_ipu_options", IPUOptions())
        _set(self, "_ipu_assignment", None)  # None: read from PipelineStage tags
        _set(self, "_ipu_replicated_logs", None)
        _set(self, "_ipu_graph", None)

    def _ipu_reset(self):
        """Options changed: the compiled functions are made again."""
        self.train_function = None
        self.test_function = None
        self.predict_function = None

    # -- the extension methods ----------------------------------------------
    def set_asynchronous_callbacks(self, asynchronous=False):
        """Graphcore: call the batch callbacks of fit and evaluate after
        every step (True), with that step's logs from the outfeed, instead
        of once per execution of `steps_per_execution` steps (False). The
        simulator runs an execution at once, then calls them step by step
        (backend/trainer.py _run_executions); ignored, as Graphcore does,
        for a pipelined model with accumulate_outfeed, and for predict."""
        self._ipu_options.asynchronous_callbacks = bool(asynchronous)

    def set_replication_options(self, replicated_metric_reduction_method="NONE"):
        """How metrics of several replicas are returned: NONE (the last
        replica's), LIST, SUM or MEAN (ReplicatedMetricReductionMethod)."""
        self._ipu_options.set_replication(replicated_metric_reduction_method)

    def set_gradient_accumulation_options(
        self,
        gradient_accumulation_steps_per_replica=None,
        gradient_accumulation_reduction_method="sum",
        use_v2_gradient_accumulation_optimizer=False,
        **gradient_accumulation_optimizer_kwargs,
    ):
        """Accumulate the gradients of `gradient_accumulation_steps_per_replica`
        batches on each replica, then all-reduce them across the replicas and
        update the weights once. `steps_per_execution` must be a multiple of
        it. The reduction method is SUM (default), MEAN or RUNNING_MEAN."""
        del use_v2_gradient_accumulation_optimizer  # one accumulation here
        self._ipu_options.set_gradient_accumulation(
            gradient_accumulation_steps_per_replica,
            gradient_accumulation_reduction_method,
            gradient_accumulation_optimizer_kwargs,
        )
        self._ipu_reset()

    def set_pipelining_options(
        self,
        gradient_accumulation_steps_per_replica=None,
        device_mapping=None,
        accumulate_outfeed=None,
        gradient_accumulation_reduction_method="sum",
        **pipelining_kwargs,
    ):
        """The options of a pipelined model: the micro-batches of each
        optimizer step (`gradient_accumulation_steps_per_replica`, needed to
        train), the IPU of each stage (`device_mapping`), metrics accumulated
        over the step (`accumulate_outfeed`), the reduction method, and the
        arguments of Graphcore's pipeline() (`pipeline_schedule`,
        `recomputation_mode`, stage Poplar options, offloading, ...)."""
        self._ipu_options.set_pipelining(
            gradient_accumulation_steps_per_replica,
            device_mapping,
            accumulate_outfeed,
            gradient_accumulation_reduction_method,
            pipelining_kwargs,
        )
        self._ipu_reset()

    def set_infeed_queue_options(self, **kwargs):
        """Options of the infeed queue fit/evaluate/predict make
        (`prefetch_depth`: batches the host keeps ready; the prediction of
        the host-to-IPU transfer accounts for it)."""
        self._ipu_options.set_infeed(kwargs)
        self._ipu_reset()

    def set_outfeed_queue_options(self, **kwargs):
        """Options of the outfeed queue (`buffer_depth`)."""
        self._ipu_options.set_outfeed(kwargs)
        self._ipu_reset()

    # -- pipeline stage assignment --------------------------------------------
    def _ipu_assignment_classes(self):
        return sa.FunctionalLayerPipelineStageAssignment, sa.FunctionalNestedModelPipelineStageAssignment

    def _ipu_graph_function(self):
        """The Keras Function whose nodes the assignment lists."""
        return self

    def _ipu_default_assignment(self):
        """One assignment per invocation, no stage set, execution order."""
        layer_cls, nested_cls = self._ipu_assignment_classes()
        out = []
        for node in post_order(self._ipu_graph_function()):
            layer = node.operation
            if isinstance(layer, KerasExtension):
                out.append(nested_cls(layer, node_index(node), layer.get_pipeline_stage_assignment()))
            else:
                out.append(layer_cls(layer, node_index(node)))
        return out

    def _ipu_assignment_from_tags(self):
        """The assignment PipelineStage contexts gave the layers, or None
        when none did."""
        nodes = post_order(self._ipu_graph_function())

        def tag(node):
            for x in node.outputs:  # the call's stage (backend/layer.py)
                stage = getattr(x, "_pipeline_stage", None)
                if stage is not None:
                    return stage
            return getattr(node.operation, "_pipeline_stage", None)

        if not any(tag(n) is not None for n in nodes):
            if not any(isinstance(n.operation, KerasExtension)
                       and n.operation._ipu_is_pipelined() for n in nodes):
                return None
        layer_cls, nested_cls = self._ipu_assignment_classes()
        made = {}  # tensor id -> stage of the node that made it
        out = []
        for node in nodes:
            layer = node.operation
            if isinstance(layer, KerasExtension):
                inner = layer.get_pipeline_stage_assignment()
                out.append(nested_cls(layer, node_index(node), inner))
                stage = sa.maximum_stage(inner) if inner else 0
            else:
                stage = tag(node)
                if stage is None:
                    from keras.src.layers.layer import Layer

                    if isinstance(layer, Layer):
                        raise ValueError(
                            "All layers of a pipelined model must have an associated "
                            f"pipeline stage. However, {layer.name} has not been "
                            "assigned to one. Pipeline stages can be assigned when a "
                            "layer is constructed, or each time a layer is called. "
                            "Different pipeline stages can assigned to each call."
                        )
                    # A keras.ops call (not a layer: no PipelineStage can
                    # reach it) runs with the latest stage it reads from.
                    stage = max((made.get(id(x), 0) for x in node.input_tensors), default=0)
                out.append(layer_cls(layer, node_index(node), stage))
            for x in node.outputs:
                made[id(x)] = stage
        return out

    def _ipu_current_assignment(self):
        if self._ipu_assignment is None:
            tagged = self._ipu_assignment_from_tags()
            if tagged is not None:
                self._ipu_check_assignment(tagged)
            _set(self, "_ipu_assignment", tagged or [])
        return self._ipu_assignment

    def _ipu_variable_stages(self):
        """{id(variable): stage} of a pipelined model's trainable weights:
        the first stage that uses each."""
        graph = self._ipu_check_assignment(self._ipu_current_assignment())
        stages = {}
        for stage, node in graph.entries:
            for v in getattr(node.operation, "trainable_variables", ()):
                stages.setdefault(id(v), stage)
        return stages

    def _ipu_is_pipelined(self):
        return bool(self._ipu_current_assignment())

    def _ipu_check_assignment(self, assignment):
        layer_cls, nested_cls = self._ipu_assignment_classes()
        return StagedGraph(self, self._ipu_graph_function(), assignment, layer_cls, nested_cls)

    def get_pipeline_stage_assignment(self):
        """The current assignment (a copy), or one unset assignment per
        layer invocation (nested models: their own lists), in execution
        order."""
        current = self._ipu_current_assignment()
        if current:
            return list(current)
        return self._ipu_default_assignment()

    def set_pipeline_stage_assignment(self, pipeline_stage_assignment):
        """Pipeline the model: one assignment per layer invocation, in the
        order get_pipeline_stage_assignment() lists them. Checked now (the
        layers of a stage may only read outputs of the same or earlier
        stages); `call()` ignores it, fit/evaluate/predict pipeline."""
        self._ipu_check_assignment(pipeline_stage_assignment)
        _set(self, "_ipu_assignment", list(pipeline_stage_assignment))
        self._ipu_reset()

    def reset_pipeline_stage_assignment(self):
        """The model is no longer pipelined."""
        _set(self, "_ipu_assignment", [])
        self._ipu_reset()

    def export_for_ipu_serving(self, export_dir, batch_size=None, output_names=None,
                               preprocessing_step=None, preprocessing_step_signature=None,
                               postprocessing_step=None, postprocessing_step_signature=None,
                               purge_export_dir=False):
        """Write the model's inference as a SavedModel for TensorFlow
        Serving and return its predict function (export/keras_serving.py)."""
        from keras_ipu.export.keras_serving import export_model

        return export_model(self, export_dir, batch_size, output_names, preprocessing_step,
                            preprocessing_step_signature, postprocessing_step,
                            postprocessing_step_signature, purge_export_dir)

    def print_pipeline_stage_assignment_summary(self, line_length=None, print_fn=None):
        """A table of each layer invocation and its stage (Graphcore's)."""
        line_length = line_length or 89
        headers = ["Layer (type) (node index)", "Input Layers", "Pipeline Stage"]
        widths = [0.4, 0.8, 1.0]

        def rows(assignment):
            inbound = [getattr(x, "name", str(x)) for x in tree.flatten(assignment.inbound_layers)]
            name = (f"{assignment.layer.name} ({type(assignment.layer).__name__}) "
                    f"({assignment.node_index})")
            yield [name, inbound[0] if inbound else "", str(assignment.pipeline_stage)]
            for other in inbound[1:]:
                yield ["", other, ""]

        _print_summary(self, headers, widths, rows, line_length, print_fn)

    # -- shards and replicas ------------------------------------------------
    def _ipu_stage_count(self):
        assignment = self._ipu_current_assignment()
        return sa.maximum_stage(assignment) + 1 if assignment else 1

    def _get_shard_count(self):
        """IPUs one replica of the model needs (not yet rounded)."""
        if not self._ipu_is_pipelined():
            return self._ipu_strategy.model_axis_ipus
        mapping = self._ipu_options.pipelining_device_mapping
        if mapping:
            return max(mapping) + 1
        return self._ipu_stage_count()

    def _get_replication_factor(self):
        """IPUs of the strategy's device / shards (a power of two)."""
        num_ipus = self._ipu_strategy._device().num_ipus
        shards = self._get_shard_count()
        rounded = rounded_shards(shards)
        if shards > num_ipus:
            raise ValueError(
                f"Current device has {num_ipus} IPUs attached, however the current "
                f"model requires a multiple of {rounded} IPUs."
            )
        return num_ipus // rounded

    def _ipu_accumulation_count(self, mode):
        """Micro-batches per optimizer step (fit), with Graphcore's checks."""
        options = self._ipu_options
        if mode != "fit":
            return 1
        if self._ipu_is_pipelined():
            count = options.pipelining_gradient_accumulation_steps_per_replica
            if count is None:
                raise ValueError(
                    "The model which you are attempting to train is pipelined, "
                    "however `gradient_accumulation_steps_per_replica` has not been "
                    "set through `set_pipelining_options()`. You need to set this "
                    "value as pipelined models will perform gradient accumulation "
                    "when training."
                )
            return count
        return options.gradient_accumulation_steps_per_replica or 1

    def _ipu_check_accumulation(self, steps_per_execution, count):
        if steps_per_execution % count:
            kind = "pipelined " if self._ipu_is_pipelined() else ""
            raise RuntimeError(
                f"The {kind}model has been configured to use gradient accumulation "
                "for training, however the current `steps_per_execution` value "
                f"(set to {steps_per_execution}) is not divisible by "
                f"`gradient_accumulation_steps_per_replica` ({count}). You need to "
                "adjust either `steps_per_execution` or "
                "`gradient_accumulation_steps_per_replica` to make sure that "
                "`steps_per_execution` is divisible by "
                "`gradient_accumulation_steps_per_replica`."
            )

    def _check_mode(self):
        if self.run_eagerly or not self.jit_compile:
            raise RuntimeError(
                "Keras models cannot run eagerly when using `IPUStrategy`. Set "
                "`run_eagerly=False` when calling `compile`."
            )

    # -- the trainer's hooks ------------------------------------------------
    def _make_epoch_iterator(self, mode, **kwargs):
        from keras_ipu.models.data import IPUDataIterator

        self._check_mode()
        # Graphcore's examples pass a tensor (dataset.cardinality()).
        kwargs["steps_per_execution"] = int(np.asarray(kwargs["steps_per_execution"]))
        kwargs = self._ipu_strategy._model_data_arguments(self, mode, kwargs)

        def replicas(iterator):
            self._ipu_note_data(iterator)
            return self._get_replication_factor()

        iterator = IPUDataIterator(replicas=replicas, **kwargs)
        count = self._ipu_accumulation_count(mode)
        if mode == "fit":
            self._ipu_check_accumulation(iterator.steps_per_execution, count)
            self._ipu_log_batch_size(iterator, count, iterator.replicas)
        return iterator

    def _ipu_note_data(self, iterator):
        """What the model learns from the data before it runs (a subclassed
        model: the shapes its graph is traced with)."""

    def _ipu_log_batch_size(self, iterator, count, replicas):
        if count <= 1 and replicas <= 1:
            return
        batch = getattr(iterator.data_adapter, "batch_size", None)
        parts = []
        if count > 1:
            parts.append(f" and accumulating {count} batches per optimizer step")
        if replicas > 1:
            parts.append(f" across {replicas} replicas")
        effective = batch * count * replicas if batch else "unknown"
        logger.info(
            "Training is%s%s, your effective batch size is %s.",
            " distributed" if replicas > 1 else " not distributed",
            "".join(parts), effective,
        )

    def _ipu_step_is_default(self, name):
        from keras_ipu.backend.trainer import IPUTrainer

        return getattr(type(self), name) is getattr(IPUTrainer, name)

    def _ipu_raise_overridden(self, name, pipelined):
        if pipelined:
            raise RuntimeError(
                f"The function `{name}` for the model {self.name} has been "
                "overridden. This is not supported for pipelined Keras models."
            )
        raise RuntimeError(
            f"The function `{name}` for the model {self.name} has been overridden. "
            "This is not supported when using Keras within an IPUStrategy with "
            "gradient accumulation or replication. Either remove the override "
            "from your model definition or set `enable_keras_extensions=False` "
            "when creating the IPUStrategy."
        )

    def _make_ipu_function(self, kind, force):
        """The `{kind}_function` of an IPU model (made once): the TensorFlow
        front end's for a tf.keras model, else models/functions'."""
        if getattr(self, "_ipu_tf_strategy", None) is not None:
            # A tf.keras model (KERAS_BACKEND=tensorflow): the TensorFlow
            # front end compiles it (issue 11).
            from keras_ipu.frontends.tensorflow import keras_trainer

            return getattr(keras_trainer, f"make_{kind}_function")(self, force)
        attribute = f"{kind}_function"
        if getattr(self, attribute) is not None and not force:
            return getattr(self, attribute)
        from keras_ipu.models import functions

        setattr(self, attribute, getattr(functions, attribute)(self))
        return getattr(self, attribute)

    def make_train_function(self, force=False):
        return self._make_ipu_function("train", force)

    def make_test_function(self, force=False):
        return self._make_ipu_function("test", force)

    def make_predict_function(self, force=False):
        return self._make_ipu_function("predict", force)

    def _get_metrics_result_or_logs(self, logs):
        # Several replicas: the logs are already reduced across them.
        if self._ipu_replicated_logs is not None and logs is self._ipu_replicated_logs:
            return logs
        return super()._get_metrics_result_or_logs(logs)

    # -- saving -------------------------------------------------------------
    # The options (not the pipeline()/optimizer kwargs, as Graphcore's) and
    # the stage assignment are an asset of the saved model (.keras files keep
    # assets per object): a model loaded in an IPUStrategy scope reads them
    # back; a plain Keras model loaded elsewhere has no load_assets and
    # leaves them alone.
    _IPU_ASSET = "ipu_extension.json"

    def save_assets(self, dir_path):
        base = getattr(super(), "save_assets", None)
        if base is not None:
            base(dir_path)
        saved = {"options": self._ipu_options.get_config()}
        try:
            assignment = self._ipu_current_assignment()
        except RuntimeError:  # a subclassed model never built: none to save
            assignment = None
        if assignment:
            saved["pipeline_stage_assignment"] = _encode_assignment(self, assignment)
        path = os.path.join(dir_path, self._IPU_ASSET)
        with _atomic_files.open_atomically(path) as f:
            json.dump(saved, f)

    def load_assets(self, dir_path):
        base = getattr(super(), "load_assets", None)
        if base is not None:
            base(dir_path)
        path = os.path.join(dir_path, self._IPU_ASSET)
        if not os.path.exists(path):
            return
        with open(path) as f:
            saved = json.load(f)
        _set(self, "_ipu_options", IPUOptions.from_config(saved.get("options", {})))
        encoded = saved.get("pipeline_stage_assignment")
        if encoded:
            _set(self, "_ipu_assignment", _decode_assignment(self, encoded))
        self._ipu_reset()

    # -- the pipelined forward pass -----------------------------------------
    def _ipu_run_staged(self, inputs, assignment, training=None):
        graph = self._ipu_check_assignment(assignment)
        return graph.run(list(inputs), training=training)

    def _ipu_staged_call(self, inputs, training=None, mask=None, **kwargs):
        """`call` while a pipelined step is traced (models/functions.py puts
        it in place of the instance's `call`): the layers stage by stage."""
        flat = tree.flatten(self._ipu_standardize(inputs))
        return self._ipu_run_staged(flat, self._ipu_current_assignment(), training)

    def _ipu_standardize(self, inputs):
        return self._standardize_inputs(inputs)


class FunctionalExtension(KerasExtension):
    """The extensions of a Functional model."""


class SequentialExtension(KerasExtension):
    """The extensions of a Sequential model: one assignment per layer."""

    def _ipu_assignment_classes(self):
        return sa.SequentialLayerPipelineStageAssignment, sa.SequentialNestedModelPipelineStageAssignment

    def _ipu_graph_function(self):
        if self._functional is None:
            raise RuntimeError(
                f"The Sequential model {self.name} has not been built: give it an "
                "`Input` (or call `build()`) before assigning pipeline stages."
            )
        return self._functional

    def _ipu_default_assignment(self):
        out = []
        for layer in self.layers:
            if isinstance(layer, KerasExtension):
                out.append(sa.SequentialNestedModelPipelineStageAssignment(
                    layer, layer.get_pipeline_stage_assignment()))
            else:
                out.append(sa.SequentialLayerPipelineStageAssignment(layer))
        return out

    def _ipu_assignment_from_tags(self):
        tagged = [getattr(layer, "_pipeline_stage", None) for layer in self.layers]
        if all(t is None for t in tagged):
            return None
        out = []
        for layer, stage in zip(self.layers, tagged):
            if isinstance(layer, KerasExtension):
                out.append(sa.SequentialNestedModelPipelineStageAssignment(
                    layer, layer.get_pipeline_stage_assignment()))
            else:
                out.append(sa.SequentialLayerPipelineStageAssignment(layer, stage))
        return out

    def set_pipeline_stage_assignment(self, pipeline_stage_assignment):
        """One stage per layer: ints, or SequentialLayerPipelineStageAssignment
        (SequentialNestedModelPipelineStageAssignment for a nested model)."""
        if not isinstance(pipeline_stage_assignment, list):
            raise ValueError("`pipeline_stage_assignment` needs to be a list.")
        if len(pipeline_stage_assignment) != len(self.layers):
            raise ValueError(
                "The length of the provided `pipeline_stage_assignment` "
                f"({len(pipeline_stage_assignment)}) does not match the number of "
                f"layers in the graph ({len(self.layers)}). Each layer needs to be "
                "assigned a pipeline stage (excluding input layers)."
            )
        assignment = [
            sa.SequentialLayerPipelineStageAssignment(layer, a) if isinstance(a, int) else a
            for layer, a in zip(self.layers, pipeline_stage_assignment)
        ]
        if not all(isinstance(a, (sa.SequentialLayerPipelineStageAssignment,
                                  sa.SequentialNestedModelPipelineStageAssignment))
                   for a in assignment):
            raise ValueError(
                "All elements of `pipeline_stage_assignment` must be instances of "
                "`SequentialLayerPipelineStageAssignment` for layers or  "
                "`SequentialNestedModelPipelineStageAssignment` for nested models."
            )
        self._ipu_check_assignment(assignment)
        _set(self, "_ipu_assignment", assignment)
        self._ipu_reset()

    def _ipu_check_assignment(self, assignment):
        sequential_stages(self, assignment)
        if self._functional is None:
            return None  # not built yet: the graph is checked when it is
        return super()._ipu_check_assignment(assignment)

    def print_pipeline_stage_assignment_summary(self, line_length=None, print_fn=None):
        def rows(assignment):
            yield [f"{assignment.layer.name} ({type(assignment.layer).__name__})",
                   str(assignment.pipeline_stage)]

        _print_summary(self, ["Layer (type)", "Pipeline Stage"], [0.5, 1.0], rows,
                       line_length or 60, print_fn)

    def _ipu_standardize(self, inputs):
        return inputs


class ModelExtension(KerasExtension):
    """The extensions of a subclassed Model: its `call` is traced once into
    a graph of layer invocations (as Graphcore's ModelExtension does), which
    the assignment lists and a pipelined model runs."""

    def _ipu_assignment_classes(self):
        return sa.ModelLayerPipelineStageAssignment, sa.NestedModelPipelineStageAssignment

    def _ipu_input_spec(self):
        spec = getattr(self, "_ipu_traced_inputs", None)
        if spec is not None:
            return spec
        shapes = getattr(self, "_build_shapes_dict", None)
        if not self.built or not shapes:
            return None
        shape = next(iter(shapes.values()))
        return _spec_of_shapes(shape)

    def _ipu_graph_function(self):
        if self._ipu_graph is not None:
            return self._ipu_graph
        spec = self._ipu_input_spec()
        if spec is None:
            raise RuntimeError(
                f"Cannot get pipeline stage assignments for model `{self.name}` "
                "which has not been built yet. Please call `model.build()` first."
            )
        from keras.src.ops.function import Function

        inputs = _symbolic_inputs(spec)
        with self._ipu_strategy.scope():
            outputs = super(KerasExtension, self).call(inputs)
        _set(self, "_ipu_graph", Function(inputs, outputs, name=f"{self.name}_graph"))
        return self._ipu_graph

    def _ipu_standardize(self, inputs):
        return inputs

    def _ipu_note_data(self, iterator):
        if self._ipu_assignment is not None or self._ipu_input_spec() is not None:
            return
        from keras.src.trainers.data_adapters import data_adapter_utils

        x, _, _ = data_adapter_utils.unpack_x_y_sample_weight(iterator.first_batch())
        _set(self, "_ipu_traced_inputs", _spec_of_arrays(x))


# A subclassed model's input spec: a structure of _Spec leaves.
class _Spec(tuple):
    """(batch shape, dtype) of one input."""


def _spec_of_shapes(shapes):
    if isinstance(shapes, dict):
        return {k: _spec_of_shapes(v) for k, v in shapes.items()}
    if isinstance(shapes, (list, tuple)) and shapes and not all(
            d is None or isinstance(d, int) for d in shapes):
        return [_spec_of_shapes(v) for v in shapes]
    return _Spec((tuple(shapes), "float32"))


def _spec_of_arrays(x):
    if isinstance(x, dict):
        return {k: _spec_of_arrays(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_spec_of_arrays(v) for v in x]
    dtype = np.asarray(x).dtype
    dtype = "float32" if dtype == np.float64 else str(dtype)
    return _Spec(((None,) + tuple(np.shape(x))[1:], dtype))


def _symbolic_inputs(spec):
    import keras

    if isinstance(spec, _Spec):
        return keras.Input(batch_shape=spec[0], dtype=spec[1])
    if isinstance(spec, dict):
        return {k: _symbolic_inputs(v) for k, v in spec.items()}
    return [_symbolic_inputs(v) for v in spec]


def _print_summary(model, headers, widths, rows, line_length, print_fn):
    print_fn = print_fn or print
    positions = [int(line_length * w) for w in widths]

    def print_row(fields):
        line = ""
        for i, field in enumerate(fields):
            if i > 0:
                line = line[:-1] + " "
            line += str(field)
            line = line[: positions[i]]
            line += " " * (positions[i] - len(line))
        print_fn(line)

    print_fn(f'Model: "{model.name}"')
    print_fn("_" * line_length)
    print_row(headers)
    print_fn("=" * line_length)

    def walk(assignments):
        for i, assignment in enumerate(assignments):
            if assignment.is_nested_model:
                print_fn(f'Nested Model: "{assignment.nested_model.name}"')
                print_fn("-" * line_length)
                walk(assignment.pipeline_stage_assignments)
                continue
            for fields in rows(assignment):
                print_row(fields)
            last = i == len(assignments) - 1 or assignments[i + 1].is_nested_model
            print_fn(("=" if last else "_") * line_length)

    walk(model.get_pipeline_stage_assignment())


def _encode_assignment(model, assignments):
    """Stage assignments as plain data: (layer index, node index, stage),
    or (layer index, node index, [nested...]) for a nested model."""
    index = {id(layer): i for i, layer in enumerate(model.layers)}
    out = []
    for a in assignments:
        if a.is_nested_model:
            out.append([index[id(a.nested_model)], getattr(a, "node_index", 0),
                        _encode_assignment(a.nested_model, a.pipeline_stage_assignments)])
        else:
            out.append([index[id(a.layer)], getattr(a, "node_index", 0), a.pipeline_stage])
    return out


def _decode_assignment(model, encoded):
    layer_cls, nested_cls = model._ipu_assignment_classes()
    sequential = layer_cls is sa.SequentialLayerPipelineStageAssignment
    out = []
    for layer_index, node, stage in encoded:
        layer = model.layers[layer_index]
        if isinstance(stage, list):
            inner = _decode_assignment(layer, stage)
            out.append(nested_cls(layer, inner) if sequential else nested_cls(layer, node, inner))
        else:
            out.append(layer_cls(layer, stage) if sequential else layer_cls(layer, node, stage))
    return out


# -- attaching -------------------------------------------------------------
_PATCHED = {}


def _extension_for(model):
    from keras.src.models.functional import Functional
    from keras.src.models.sequential import Sequential

    if isinstance(model, Sequential):
        return SequentialExtension
    if isinstance(model, Functional):
        return FunctionalExtension
    return ModelExtension


def _patched_class(cls, extension):
    key = (cls, extension)
    patched = _PATCHED.get(key)
    if patched is None:
        patched = type(cls.__name__, (extension, cls), {
            "__module__": cls.__module__,
            "__qualname__": cls.__qualname__,
            "__doc__": cls.__doc__,
        })
        # Saved under the registered name of the class it extends.
        from keras.src.saving import object_registration

        name = object_registration.GLOBAL_CUSTOM_NAMES.get(cls)
        if name is not None:
            object_registration.GLOBAL_CUSTOM_NAMES[patched] = name
        _PATCHED[key] = patched
    return patched


def attach(model, strategy):
    """Give `model` (being constructed) the IPU extensions of `strategy`."""
    if isinstance(model, KerasExtension):
        return
    extension = _extension_for(model)
    model.__class__ = _patched_class(type(model), extension)
    model._ipu_extension_init(strategy)
