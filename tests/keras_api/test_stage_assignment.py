"""Pipeline stage assignment of Sequential, Functional (one entry per layer
invocation, shared layers), nested and subclassed models; PipelineStage."""

import io

import keras
import numpy as np
import pytest

import keras_ipu as ipu
from keras_ipu.device.config import system_config

from ipu_keras_helpers import configure
from ipu_keras_helpers import max_weight_difference
from ipu_keras_helpers import regression_data


def fit_pipelined(model, x, y, count=4):
    model.set_pipelining_options(gradient_accumulation_steps_per_replica=count)
    model.compile(keras.optimizers.SGD(0.05), "mse", steps_per_execution=count)
    model.fit(x, y, batch_size=4, verbose=0, shuffle=False)


def fit_accumulated(model, x, y, count=4):
    model.set_gradient_accumulation_options(gradient_accumulation_steps_per_replica=count)
    model.compile(keras.optimizers.SGD(0.05), "mse", steps_per_execution=count)
    model.fit(x, y, batch_size=4, verbose=0, shuffle=False)


def shared_layer_model(strategy):
    keras.utils.set_random_seed(5)
    with strategy.scope():
        inputs = keras.Input((8,))
        shared = keras.layers.Dense(8, activation="tanh", name="shared")
        a = shared(inputs)
        b = shared(a)
        out = keras.layers.Dense(1, name="head")(keras.layers.Add(name="add")([a, b]))
        return keras.Model(inputs, out)


def test_functional_assignment_has_one_entry_per_invocation():
    configure(2)
    strategy = ipu.ipu_strategy.IPUStrategy()
    model = shared_layer_model(strategy)
    assignment = model.get_pipeline_stage_assignment()
    assert [(a.layer.name, a.node_index) for a in assignment] == [
        ("shared", 0), ("shared", 1), ("add", 0), ("head", 0)]
    assert all(isinstance(a, ipu.keras.FunctionalLayerPipelineStageAssignment) for a in assignment)
    assert [layer.name for layer in assignment[1].inbound_layers] == ["shared"]
    for a, stage in zip(assignment, [0, 1, 1, 1]):  # the shared layer in two stages
        a.pipeline_stage = stage
    with pytest.raises(ValueError, match="Each layer needs to be assigned a pipeline stage"):
        model.set_pipeline_stage_assignment(assignment[:3])
    model.set_pipeline_stage_assignment(assignment)
    lines = []
    model.print_pipeline_stage_assignment_summary(print_fn=lines.append)
    assert lines[0] == f'Model: "{model.name}"'
    assert any(line.startswith("shared (Dense) (1)") and line.rstrip().endswith("1") for line in lines)

    x, y = regression_data(n=16)
    with strategy.scope():
        fit_pipelined(model, x, y)
    reference = shared_layer_model(strategy)
    system_config.reset_ipu_configuration()
    with strategy.scope():
        fit_accumulated(reference, x, y)
    assert max_weight_difference(model, reference) < 1e-6


def test_assignment_errors():
    strategy = ipu.ipu_strategy.IPUStrategy()
    model = shared_layer_model(strategy)
    assignment = model.get_pipeline_stage_assignment()
    for a, stage in zip(assignment, [1, 0, 1, 1]):
        a.pipeline_stage = stage
    with pytest.raises(ValueError, match="Layer shared in pipeline stage 0 has a dependency "
                       "from a pipeline stage which has not yet been executed"):
        model.set_pipeline_stage_assignment(assignment)
    assignment[0].pipeline_stage = None
    with pytest.raises(ValueError, match="Layer shared with node_index 0 has not been assigned "
                       "a pipeline stage"):
        model.set_pipeline_stage_assignment(assignment)
    swapped = [assignment[1], assignment[0]] + assignment[2:]
    with pytest.raises(ValueError, match="post-order generated from the graph"):
        model.set_pipeline_stage_assignment(swapped)
    for a, stage in zip(assignment, [0, 2, 2, 2]):
        a.pipeline_stage = stage
    model.set_pipeline_stage_assignment(assignment)
    configure(4)
    x, y = regression_data(n=16)
    with strategy.scope():
        model.set_pipelining_options(gradient_accumulation_steps_per_replica=4)
        model.compile("sgd", "mse", steps_per_execution=4)
        with pytest.raises(RuntimeError, match=r"All stages in a pipeline must have at lease one "
                           r"layer assigned to them. The highest stage with an assignment is "
                           r"stage 2, however the preceeding stages \[1\] had no assignments."):
            model.fit(x, y, batch_size=4, verbose=0)


def test_sequential_assignment():
    configure(2)
    strategy = ipu.ipu_strategy.IPUStrategy()
    keras.utils.set_random_seed(2)
    with strategy.scope():
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(8, activation="relu"),
                                  keras.layers.Dense(4, activation="relu"),
                                  keras.layers.Dense(1, name="last")])
    assert all(a.pipeline_stage is None for a in model.get_pipeline_stage_assignment())
    with pytest.raises(ValueError, match="The first layer in a pipelined sequential model needs "
                       "to be assigned to the 0th pipeline stage, however it was assigned to 1"):
        model.set_pipeline_stage_assignment([1, 1, 1])
    with pytest.raises(ValueError, match="Layer last has been assigned to pipeline stage 2, "
                       "however the previous layer in the Sequential model was assigned to "
                       "pipeline stage 0"):
        model.set_pipeline_stage_assignment([0, 0, 2])
    with pytest.raises(ValueError, match=r"The length of the provided `pipeline_stage_assignment` \(2\)"):
        model.set_pipeline_stage_assignment([0, 1])
    model.set_pipeline_stage_assignment([0, 0, 1])
    assert [a.pipeline_stage for a in model.get_pipeline_stage_assignment()] == [0, 0, 1]
    buffer = io.StringIO()
    model.print_pipeline_stage_assignment_summary(print_fn=lambda s: buffer.write(s + "\n"))
    assert "last (Dense)" in buffer.getvalue()
    x, y = regression_data(n=16)
    with strategy.scope():
        fit_pipelined(model, x, y)
    assert model._ipu_is_pipelined()
    model.reset_pipeline_stage_assignment()
    assert not model._ipu_is_pipelined()


def test_pipeline_stage_context():
    strategy = ipu.ipu_strategy.IPUStrategy()
    with pytest.raises(RuntimeError, match="PipelineStage may only be used from within an "
                       "IPUStrategy context"):
        with ipu.keras.PipelineStage(0):
            pass
    with strategy.scope():
        with pytest.raises(RuntimeError, match="Pipeline stages must not be nested"):
            with ipu.keras.PipelineStage(0):
                with ipu.keras.PipelineStage(1):
                    pass
        with pytest.raises(ValueError, match="-1 is not a valid pipeline stage"):
            with ipu.keras.PipelineStage(-1):
                pass
        inputs = keras.Input((8,))
        with ipu.keras.PipelineStage(0):
            dense = keras.layers.Dense(8)  # constructed in stage 0
        x = dense(inputs)
        with ipu.keras.PipelineStage(1):
            x = dense(x)  # this call: stage 1
        untagged = keras.layers.Dense(1, name="untagged")(x)
        model = keras.Model(inputs, untagged)
    with pytest.raises(ValueError, match="All layers of a pipelined model must have an associated "
                       "pipeline stage. However, untagged has not been assigned to one"):
        model.get_pipeline_stage_assignment()


def test_nested_functional_model():
    configure(2)
    strategy = ipu.ipu_strategy.IPUStrategy()

    def build(staged):
        keras.utils.set_random_seed(7)
        with strategy.scope():
            inner_in = keras.Input((8,))
            inner = keras.Model(inner_in, keras.layers.Dense(8, activation="relu")(inner_in), name="inner")
            inputs = keras.Input((8,))
            x = keras.layers.Dense(8, activation="relu")(inputs)
            x = inner(x)
            out = keras.layers.Dense(1)(x)
            model = keras.Model(inputs, out)
        if staged:
            assignment = model.get_pipeline_stage_assignment()
            assert isinstance(assignment[1], ipu.keras.FunctionalNestedModelPipelineStageAssignment)
            assignment[0].pipeline_stage = 0
            for a in assignment[1].pipeline_stage_assignments:
                a.pipeline_stage = 1
            assignment[2].pipeline_stage = 1
            model.set_pipeline_stage_assignment(assignment)
        return model

    x, y = regression_data(n=16)
    pipelined = build(True)
    lines = []
    pipelined.print_pipeline_stage_assignment_summary(print_fn=lines.append)
    assert 'Nested Model: "inner"' in lines
    with strategy.scope():
        fit_pipelined(pipelined, x, y)
    reference = build(False)
    system_config.reset_ipu_configuration()
    with strategy.scope():
        fit_accumulated(reference, x, y)
    assert pipelined._get_shard_count() == 2
    assert max_weight_difference(pipelined, reference) < 1e-6


class Subclassed(keras.Model):
    def __init__(self, staged=False, **kwargs):
        super().__init__(**kwargs)
        self.staged = staged
        self.first = keras.layers.Dense(8, activation="relu")
        self.second = keras.layers.Dense(1)

    def call(self, x):
        if not self.staged:
            return self.second(self.first(x))
        with ipu.keras.PipelineStage(0):
            x = self.first(x)
        with ipu.keras.PipelineStage(1):
            return self.second(x)


def test_subclassed_model():
    configure(2)
    strategy = ipu.ipu_strategy.IPUStrategy()
    x, y = regression_data(n=16)
    keras.utils.set_random_seed(9)
    with strategy.scope():
        model = Subclassed()
    with pytest.raises(RuntimeError, match="Cannot get pipeline stage assignments for model "
                       f"`{model.name}` which has not been built yet"):
        model.get_pipeline_stage_assignment()
    model.build((None, 8))
    assignment = model.get_pipeline_stage_assignment()
    assert [type(a).__name__ for a in assignment] == ["ModelLayerPipelineStageAssignment"] * 2
    assignment[0].pipeline_stage, assignment[1].pipeline_stage = 0, 1
    model.set_pipeline_stage_assignment(assignment)
    with strategy.scope():
        fit_pipelined(model, x, y)
    keras.utils.set_random_seed(9)
    with strategy.scope():
        reference = Subclassed()
    system_config.reset_ipu_configuration()
    with strategy.scope():
        fit_accumulated(reference, x, y)
    assert max_weight_difference(model, reference) < 1e-6
    # PipelineStage inside call(): the traced graph carries the stages.
    configure(2)
    keras.utils.set_random_seed(9)
    with strategy.scope():
        tagged = Subclassed(staged=True)
        fit_pipelined(tagged, x, y)
    assert [a.pipeline_stage for a in tagged.get_pipeline_stage_assignment()] == [0, 1]
    assert max_weight_difference(tagged, reference) < 1e-6

