"""Pipeline stage assignments, Graphcore's `keras.ipu.*PipelineStageAssignment`.

A Sequential model has one assignment per layer; a Functional model (and a
subclassed model, through the graph its `call` traces) one per layer
*invocation* (a shared layer called twice has two, told apart by
`node_index`); a nested model has one holding the assignments of its own
layers. `model.get_pipeline_stage_assignment()` lists them in execution
order with no stage set; set each `pipeline_stage` and give the list back
to `model.set_pipeline_stage_assignment()`.
"""


class _LayerAssignment:
    """The stage of one layer (or of one of its calls, with _OneCall)."""

    # Graphcore's attribute telling the two kinds apart: a fact of the class.
    is_nested_model = False

    def __init__(self, layer, pipeline_stage=None):
        self._operation = layer
        self.pipeline_stage = pipeline_stage

    @property
    def layer(self):
        """The Keras layer of this assignment."""
        return self._operation


class _NestedAssignment:
    """The assignments of the layers of a nested model (or of one of its
    calls, with _OneCall)."""

    is_nested_model = True

    def __init__(self, nested_model, pipeline_stage_assignments):
        self._operation = nested_model
        self._pipeline_stage_assignments = list(pipeline_stage_assignments)

    @property
    def nested_model(self):
        return self._operation

    @property
    def pipeline_stage_assignments(self):
        return list(self._pipeline_stage_assignments)

    def _str(self, where):
        inner = "".join(f"\n  {x}" for x in self.pipeline_stage_assignments)
        return f"Model: {self.nested_model.name}{where} has the following pipeline stage assignments:{inner}"


class _OneCall:
    """Mixin: the assignment is for one call (graph node) of the layer or
    nested model it holds (`_operation`); a layer or model called twice has
    two."""

    @property
    def node_index(self):
        """Which call of the layer: 0 for the first."""
        return self._node_index

    @property
    def inbound_layers(self):
        """The layers whose outputs this call takes: tells calls apart."""
        node = self._operation._inbound_nodes[self._node_index]
        return [n.operation for n in node.parent_nodes]


class ModelLayerPipelineStageAssignment(_OneCall, _LayerAssignment):
    """The stage of one invocation of a layer in a subclassed `Model`."""

    def __init__(self, layer, node_index, pipeline_stage=None):
        super().__init__(layer, pipeline_stage)
        self._node_index = node_index

    def __str__(self):
        return (f"Layer: {self.layer.name} (node index {self.node_index}) is "
                f"assigned to pipeline stage: {self.pipeline_stage}")


class FunctionalLayerPipelineStageAssignment(ModelLayerPipelineStageAssignment):
    """The stage of one invocation of a layer in a Functional model."""


class SequentialLayerPipelineStageAssignment(_LayerAssignment):
    """The stage of one layer of a Sequential model."""

    def __str__(self):
        return f"Layer: {self.layer.name} is assigned to pipeline stage: {self.pipeline_stage}"


class NestedModelPipelineStageAssignment(_OneCall, _NestedAssignment):
    """The assignments of a model called inside a subclassed `Model` (one
    per call of the nested model)."""

    def __init__(self, nested_model, node_index, pipeline_stage_assignments):
        super().__init__(nested_model, pipeline_stage_assignments)
        self._node_index = node_index

    def __str__(self):
        return self._str(f" (node index {self.node_index})")


class FunctionalNestedModelPipelineStageAssignment(NestedModelPipelineStageAssignment):
    """The assignments of a model called inside a Functional model."""


class SequentialNestedModelPipelineStageAssignment(_NestedAssignment):
    """The assignments of a model that is a layer of a Sequential model."""

    def __str__(self):
        return self._str("")


LAYER_ASSIGNMENTS = (
    ModelLayerPipelineStageAssignment,
    SequentialLayerPipelineStageAssignment,
)
NESTED_ASSIGNMENTS = (
    NestedModelPipelineStageAssignment,
    SequentialNestedModelPipelineStageAssignment,
)


def maximum_stage(assignments):
    """The highest stage of a list of assignments (nested ones included)."""
    return max(
        maximum_stage(a.pipeline_stage_assignments) if a.is_nested_model
        else a.pipeline_stage
        for a in assignments
    )
