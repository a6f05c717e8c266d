"""A model's graph in pipeline-stage order, checked and run.

A pipelined Functional model (and a subclassed model, through the graph
its `call` traces) runs its layer invocations stage by stage: every
invocation of stage 0 in execution order, then stage 1, ... A nested model
contributes its own invocations at their own stages. `StagedGraph` builds
that order from a list of assignments, with Graphcore's checks (one
assignment per invocation, in execution order, every stage used, no layer
reading the output of a later stage), and `run` executes it on values
(inside a compiled step: every node traced in its stage's scope,
trace.stage_scope, so the node records its stage for the placement pass).
"""

import contextlib

from keras.src import tree
from keras.src.models.functional import operation_fn

from keras_ipu.device.trace import stage_scope
from keras_ipu.models import stage_assignment as sa


def post_order(function):
    """The non-input nodes of a Keras Function in execution order (the
    order Keras' own _run_through_graph runs them)."""
    nodes = []
    for depth in sorted(function._nodes_by_depth, reverse=True):
        for node in function._nodes_by_depth[depth]:
            if node.operation is None or node.is_input:
                continue
            nodes.append(node)
    return nodes


def node_index(node):
    return node.operation._inbound_nodes.index(node)


def is_extension_model(operation):
    from keras_ipu.models.extension import KerasExtension

    return isinstance(operation, KerasExtension)


class StagedGraph:
    """The invocations of `function` (a Functional model, or the graph a
    subclassed model traced) ordered by stage; `owner` names the model in
    messages; `layer_cls` / `nested_cls` are the assignment classes the
    model takes."""

    def __init__(self, owner, function, assignments, layer_cls, nested_cls):
        self.owner = owner
        self.function = function
        self.entries = []  # (stage, node)
        self.aliases = {}  # tensor id -> ids that take the same value
        self._collect(owner, function, assignments, layer_cls, nested_cls)
        self.max_stage = max((s for s, _ in self.entries), default=0)
        self._order()

    # -- building ---------------------------------------------------------
    def _alias(self, src, dst):
        self.aliases.setdefault(src, []).append(dst)

    def _collect(self, owner, function, assignments, layer_cls, nested_cls):
        nodes = post_order(function)
        if not isinstance(assignments, list):
            raise ValueError("`pipeline_stage_assignment` needs to be a list.")
        if len(assignments) != len(nodes):
            raise ValueError(
                f"The length of the provided `pipeline_stage_assignment` "
                f"({len(assignments)}) does not match the number of layers in the "
                f"graph ({len(nodes)}). Each layer needs to be assigned a pipeline "
                "stage (excluding input layers)."
            )
        for assignment, node in zip(assignments, nodes):
            layer = node.operation
            if is_extension_model(layer):
                if not isinstance(assignment, nested_cls):
                    raise ValueError(
                        f"The pipeline stage assignment for nested model {layer.name} "
                        f"in {owner.name} must be an instance of "
                        f"`{nested_cls.__name__}`. Instead the assignment was of "
                        f"type {type(assignment).__name__}."
                    )
                if assignment.nested_model is not layer:
                    raise ValueError(
                        "The order of `pipeline_stage_assignment` does not match the "
                        f"post-order generated from the graph "
                        f"({assignment.nested_model.name} != {layer.name})."
                    )
                inner = layer._ipu_graph_function()
                outer_in = node.input_tensors
                if len(outer_in) != len(inner.inputs):
                    raise NotImplementedError(
                        f"Nested model {layer.name} is called with {len(outer_in)} "
                        f"tensors for its {len(inner.inputs)} inputs: pipelining a "
                        "nested model needs it called on its inputs alone."
                    )
                for x, y in zip(outer_in, inner.inputs):
                    self._alias(id(x), id(y))
                for y, x in zip(tree.flatten(inner.outputs), node.outputs):
                    self._alias(id(y), id(x))
                inner_layer_cls, inner_nested_cls = layer._ipu_assignment_classes()
                self._collect(layer, inner, assignment.pipeline_stage_assignments,
                              inner_layer_cls, inner_nested_cls)
                continue
            if not isinstance(assignment, layer_cls):
                raise ValueError(
                    f"The pipeline stage assignment for layer {layer.name} in "
                    f"{owner.name} must be an instance of `{layer_cls.__name__}`. "
                    f"Instead the assignment was of type {type(assignment).__name__}."
                )
            if assignment.layer is not layer:
                raise ValueError(
                    "The order of `pipeline_stage_assignment` does not match the "
                    f"post-order generated from the graph ({assignment.layer.name} "
                    f"!= {layer.name})."
                )
            if getattr(assignment, "node_index", None) is not None:
                if assignment.node_index >= len(layer._inbound_nodes):
                    raise ValueError(
                        f"Layer {layer.name} has {len(layer._inbound_nodes)} "
                        "invocation(s) in the graph, but `pipeline_stage_assignment` "
                        f"contains an assignment for node_index {assignment.node_index}."
                    )
                if layer._inbound_nodes[assignment.node_index] is not node:
                    raise ValueError(
                        "The order of `pipeline_stage_assignment` does not match the "
                        "post-order generated from the graph (missmatched nodes of "
                        f"layer {layer.name})."
                    )
            stage = assignment.pipeline_stage
            if stage is None:
                index = getattr(assignment, "node_index", None)
                where = "" if index is None else f" with node_index {index}"
                raise ValueError(
                    f"Layer {layer.name}{where} has not been assigned a pipeline "
                    "stage in `pipeline_stage_assignment`."
                )
            if not isinstance(stage, int) or stage < 0:
                raise ValueError(f"{stage} is not a valid pipeline stage.")
            self.entries.append((stage, node))

    def _order(self):
        by_stage = {}
        for stage, node in self.entries:
            by_stage.setdefault(stage, []).append(node)
        computed = set()
        for x in self.function.inputs:
            self._mark(id(x), computed)
        ordered = []
        for stage in range(self.max_stage + 1):
            for node in by_stage.get(stage, []):
                if not all(id(x) in computed for x in node.input_tensors):
                    raise ValueError(
                        f"Layer {node.operation.name} in pipeline stage {stage} has a "
                        "dependency from a pipeline stage which has not yet been "
                        "executed. Layers can only use outputs from current or "
                        "previous pipeline stages."
                    )
                for x in node.outputs:
                    self._mark(id(x), computed)
                ordered.append((stage, node))
        self.entries = ordered
        self.stages_used = sorted(by_stage)

    def _mark(self, tensor_id, computed):
        computed.add(tensor_id)
        for alias in self.aliases.get(tensor_id, ()):
            self._mark(alias, computed)

    def check_every_stage_used(self):
        missing = sorted(set(range(self.max_stage + 1)) - set(self.stages_used))
        if missing:
            raise RuntimeError(
                "All stages in a pipeline must have at lease one layer assigned to "
                "them. The highest stage with an assignment is stage "
                f"{self.max_stage}, however the preceeding stages {missing} had no "
                "assignments."
            )

    # -- running ----------------------------------------------------------
    def run(self, inputs, training=None, **call_context):
        """The function's outputs for `inputs` (flat, in function.inputs
        order), each node called in its stage's scope."""
        values = {}

        def set_value(tensor_id, value):
            values[tensor_id] = value
            for alias in self.aliases.get(tensor_id, ()):
                set_value(alias, value)

        for x, value in zip(self.function.inputs, inputs):
            set_value(id(x), value)
        for stage, node in self.entries:
            args, kwargs = node.arguments.fill_in(values)
            op = operation_fn(node.operation, training=training, **call_context)
            with stage_scope(stage), _backend_stage_scope(stage):
                outputs = op(*args, **kwargs)
            for x, y in zip(node.outputs, tree.flatten(outputs)):
                set_value(id(x), y)
        flat = [values[id(x)] for x in self.function.outputs]
        return tree.pack_sequence_as(self.function._outputs_struct, flat)


def _backend_stage_scope(stage):
    """Under KERAS_BACKEND=tensorflow a stage's TensorFlow ops are named in
    its scope, pipeline_stage_<k>, by which the TensorFlow front end places
    them (frontends/tensorflow/stages.py); the ipu backend's tracer records
    the stage itself (stage_scope)."""
    from keras.src import backend

    if backend.backend() != "tensorflow":
        return contextlib.nullcontext()
    from keras_ipu.frontends.tensorflow.stages import name_scope

    return name_scope(stage)


def sequential_stages(model, assignments):
    """Graphcore's checks of a Sequential model's assignment (without
    nested models: stage 0 first, then each layer on the stage of the
    previous one or the next)."""
    previous = 0
    for i, assignment in enumerate(assignments):
        if assignment.is_nested_model:
            stages = [sa.maximum_stage([a]) for a in assignment.pipeline_stage_assignments]
            if any(s is None for s in stages):
                raise ValueError(
                    f"Layer {assignment.nested_model.name} has not been assigned a "
                    "pipeline stage."
                )
            previous = max(stages + [previous])
            continue
        if assignment.pipeline_stage is None:
            raise ValueError(
                f"Layer {assignment.layer.name} has not been assigned a pipeline stage."
            )
        if model.layers[i] is not assignment.layer:
            raise ValueError(
                f"The provided assignment at index {i} `pipeline_stage_assignment` is "
                f"for layer {assignment.layer.name}, but the layer in the Sequential "
                f"model at index {i} is {model.layers[i].name}."
            )
        stage = assignment.pipeline_stage
        if i == 0 and stage != 0:
            raise ValueError(
                "The first layer in a pipelined sequential model needs to be assigned "
                f"to the 0th pipeline stage, however it was assigned to {stage}."
            )
        if i > 0 and stage not in (previous, previous + 1):
            raise ValueError(
                f"Layer {assignment.layer.name} has been assigned to pipeline stage "
                f"{stage}, however the previous layer in the Sequential model was "
                f"assigned to pipeline stage {previous}. A layer in a Sequential model "
                "can only be assigned to the same pipeline stage as the previous "
                "layer or to the next pipeline stage."
            )
        previous = stage
