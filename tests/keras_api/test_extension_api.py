"""The extension methods of models made in an IPUStrategy scope, their
checks and Graphcore's messages; shard and replica counts."""

import logging

import keras
import pytest

import keras_ipu as ipu
from keras_ipu.ops.pipelining_ops import PipelineSchedule
from keras_ipu.ops.pipelining_ops import PipelineStageOptions

from ipu_keras_helpers import configure
from ipu_keras_helpers import mlp
from ipu_keras_helpers import regression_data


def test_models_made_in_the_scope_get_the_extensions():
    strategy = ipu.ipu_strategy.IPUStrategy()
    outside = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    assert not hasattr(outside, "set_pipelining_options")
    with strategy.scope():
        inside = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    assert type(inside).__name__ == "Sequential" and isinstance(inside, keras.Sequential)
    assert hasattr(inside, "set_pipelining_options")
    off = ipu.ipu_strategy.IPUStrategy(enable_keras_extensions=False)
    with off.scope():
        plain = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    assert not hasattr(plain, "set_gradient_accumulation_options")


@pytest.mark.parametrize("kwargs, error, message", [
    ({"gradient_accumulation_steps_per_replica": 0}, ValueError,
     "Expected `gradient_accumulation_steps_per_replica` to be a positive integer, but got 0"),
    ({"opt": 1}, ValueError, "Found `opt` key in `gradient_accumulation_optimizer_kwargs`"),
    ({"num_mini_batches": 2}, ValueError, "Found `num_mini_batches` key"),
    ({"experimental_normalize_gradients": True}, ValueError, "has now been removed"),
    ({"gradient_accumulation_reduction_method": "max"}, ValueError,
     "Cannot parse max as one of GradientAccumulationReductionMethod"),
])
def test_gradient_accumulation_options_are_checked(kwargs, error, message):
    strategy = ipu.ipu_strategy.IPUStrategy()
    model = mlp(strategy)
    with pytest.raises(error, match=message):
        model.set_gradient_accumulation_options(**kwargs)


@pytest.mark.parametrize("kwargs, error, message", [
    ({"gradient_accumulation_count": 4}, ValueError,
     "Found `gradient_accumulation_count` key in `pipelining_kwargs`. Set the "
     "`gradient_accumulation_steps_per_replica` argument"),
    ({"repeat_count": 2}, ValueError, "This argument is automatically set by Keras"),
    ({"outfeed_mask": [True]}, ValueError, "This argument is not compatible with Keras"),
    ({"batch_serialization_iterations": 2}, ValueError, "not compatible with Keras"),
    ({"pipeline_schedule": "Grouped"}, TypeError,
     "The given pipeline_schedule is not a member of the PipelineSchedule enumeration"),
    ({"recomputation_mode": 1}, TypeError, "not a member of the RecomputationMode"),
    ({"device_mapping": (0, 1)}, ValueError, "Expected `device_mapping` to be a list of integers"),
    ({"forward_propagation_stages_poplar_options": [1]}, TypeError,
     "Expected all elements of forward_propagation_stages_poplar_options to be of type"),
    ({"continuous_weight_updates": True}, NotImplementedError,
     "Continuous weight updates are currently not supported"),
    ({"unknown_option": 1}, TypeError, "pipeline\\(\\) got an unexpected keyword argument 'unknown_option'"),
])
def test_pipelining_options_are_checked(kwargs, error, message):
    strategy = ipu.ipu_strategy.IPUStrategy()
    model = mlp(strategy)
    with pytest.raises(error, match=message):
        model.set_pipelining_options(**kwargs)


def test_other_options_are_checked():
    strategy = ipu.ipu_strategy.IPUStrategy()
    model = mlp(strategy)
    with pytest.raises(ValueError, match="Cannot parse median as a ReplicatedMetricReductionMethod. "
                       "Valid values are: NONE, LIST, SUM, MEAN."):
        model.set_replication_options("median")
    with pytest.raises(ValueError, match="Found `dataset` key in `kwargs`. This argument is "
                       "automatically set by Keras."):
        model.set_infeed_queue_options(dataset=None)
    with pytest.raises(ValueError, match="Found `outfeed_mode` key in `kwargs`. This argument is "
                       "not compatible with Keras."):
        model.set_outfeed_queue_options(outfeed_mode=None)
    model.set_infeed_queue_options(prefetch_depth=3)
    model.set_outfeed_queue_options(buffer_depth=2)
    model.set_asynchronous_callbacks(True)
    assert model._ipu_options.prefetch_depth == 3 and model._ipu_options.buffer_depth == 2
    PipelineStageOptions(matmul_options={"availableMemoryProportion": "0.2"})
    with pytest.raises(TypeError, match="PipelineStageOptions.matmul_options must be dictionary"):
        PipelineStageOptions(matmul_options=[1])


def test_training_rules_of_accumulation_and_pipelining():
    x, y = regression_data(n=32)
    strategy = ipu.ipu_strategy.IPUStrategy()
    configure(2)
    pipelined = mlp(strategy, stages=[0, 0, 1])
    with strategy.scope():
        pipelined.compile("sgd", "mse", steps_per_execution=4)
        with pytest.raises(ValueError, match="The model which you are attempting to train is "
                           "pipelined, however `gradient_accumulation_steps_per_replica` has "
                           "not been set"):
            pipelined.fit(x, y, batch_size=4, verbose=0)
        pipelined.set_pipelining_options(gradient_accumulation_steps_per_replica=8)
        with pytest.raises(RuntimeError, match=r"The pipelined model has been configured to use "
                           r"gradient accumulation for training, however the current "
                           r"`steps_per_execution` value \(set to 4\) is not divisible by "
                           r"`gradient_accumulation_steps_per_replica` \(8\)"):
            pipelined.fit(x, y, batch_size=4, verbose=0)
        pipelined.set_pipelining_options(gradient_accumulation_steps_per_replica=2)
        # Grouped, 2 stages training: 4 micro-batches in flight.
        with pytest.raises(ValueError, match="The number of iterations of the pipeline must be a "
                           "multiple of 4, but it is 2. This number might be called "
                           "`gradient_accumulation_count`"):
            pipelined.fit(x, y, batch_size=4, verbose=0)
        pipelined.set_pipelining_options(gradient_accumulation_steps_per_replica=4,
                                         device_mapping=[0, 0],
                                         pipeline_schedule=PipelineSchedule.Interleaved)
        with pytest.raises(NotImplementedError, match="The pipelining schedule 'Interleaved' "
                           "does not currently support multiple pipeline stages on the same "
                           "device for training graphs"):
            pipelined.fit(x, y, batch_size=4, verbose=0)


def test_shard_count_and_replication_factor():
    strategy = ipu.ipu_strategy.IPUStrategy()
    model = mlp(strategy, stages=[0, 1, 2], batch_norm=True)
    assert model._get_shard_count() == 3
    with pytest.raises(ValueError, match="Current device has 1 IPUs attached, however the "
                       "current model requires a multiple of 4 IPUs."):
        model._get_replication_factor()
    configure(8)
    assert model._get_replication_factor() == 2  # 3 stages -> 4 IPUs a replica
    model.set_pipelining_options(device_mapping=[0, 1, 0])
    assert model._get_shard_count() == 2 and model._get_replication_factor() == 4
    model.reset_pipeline_stage_assignment()
    assert model._get_shard_count() == 1 and model._get_replication_factor() == 8


def test_single_stage_pipelines_and_batch_normalization_warn_or_fail(caplog):
    configure(2)
    x, y = regression_data(n=32)
    strategy = ipu.ipu_strategy.IPUStrategy()
    one_stage = mlp(strategy, stages=[0, 0, 0])
    with strategy.scope():
        one_stage.set_pipelining_options(gradient_accumulation_steps_per_replica=4)
        one_stage.compile("sgd", "mse", steps_per_execution=4)
        with pytest.raises(ValueError, match="Pipeline requires at least two computational stages"):
            one_stage.fit(x, y, batch_size=4, verbose=0)
    bn = mlp(strategy, stages=[0, 1, 1], batch_norm=True)
    with strategy.scope():
        bn.set_pipelining_options(gradient_accumulation_steps_per_replica=4)
        bn.compile("sgd", "mse", steps_per_execution=4)
        with caplog.at_level(logging.WARNING, logger="keras_ipu"):
            bn.fit(x, y, batch_size=4, verbose=0)
    assert "The moving statistics for keras.BatchNormalization layers in pipelined models" in caplog.text


def test_effective_batch_size_is_logged(caplog):
    configure(2)
    x, y = regression_data(n=64)
    strategy = ipu.ipu_strategy.IPUStrategy()
    model = mlp(strategy)
    with strategy.scope():
        model.set_gradient_accumulation_options(gradient_accumulation_steps_per_replica=2)
        model.compile("sgd", "mse", steps_per_execution=4)
        with caplog.at_level(logging.INFO, logger="keras_ipu"):
            model.fit(x, y, batch_size=4, verbose=0)
    assert ("Training is distributed and accumulating 2 batches per optimizer step across "
            "2 replicas, your effective batch size is 16.") in caplog.text


def test_overridden_train_step_is_refused_where_it_is_transformed():
    class Custom(keras.Sequential):
        def train_step(self, state, data):
            return super().train_step(state, data)

    x, y = regression_data(n=16)
    strategy = ipu.ipu_strategy.IPUStrategy()
    with strategy.scope():
        model = Custom([keras.Input((8,)), keras.layers.Dense(1)])
        model.compile("sgd", "mse")
        model.fit(x, y, batch_size=4, verbose=0)  # one replica: runs
        model.set_gradient_accumulation_options(gradient_accumulation_steps_per_replica=2)
        model.compile("sgd", "mse", steps_per_execution=2)
        with pytest.raises(RuntimeError, match="The function `train_step` for the model "):
            model.fit(x, y, batch_size=4, verbose=0)


def test_options_and_stages_are_saved_with_the_model(tmp_path):
    import numpy as np

    from ipu_keras_helpers import mlp

    strategy = ipu.ipu_strategy.IPUStrategy()
    model = mlp(strategy, stages=[0, 0, 1])
    model.set_pipelining_options(gradient_accumulation_steps_per_replica=4, device_mapping=[0, 0],
                                 accumulate_outfeed=True)
    model.set_replication_options("MEAN")
    model.compile("sgd", "mse")
    path = str(tmp_path / "model.keras")
    model.save(path)
    with strategy.scope():
        loaded = keras.saving.load_model(path)
    options = loaded._ipu_options
    assert options.pipelining_gradient_accumulation_steps_per_replica == 4
    assert options.pipelining_device_mapping == [0, 0] and options.pipelining_accumulate_outfeed
    assert options.replicated_metric_reduction_method.name == "MEAN"
    assert [a.pipeline_stage for a in loaded.get_pipeline_stage_assignment()] == [0, 1]
    plain = keras.saving.load_model(path)  # outside a scope: a plain Keras model
    assert not hasattr(plain, "set_pipelining_options")
    for mine, theirs in zip(plain.get_weights(), model.get_weights()):
        np.testing.assert_array_equal(mine, theirs)
    assert plain.predict(np.ones((2, 8), np.float32), verbose=0).shape == (2, 1)

    with strategy.scope():
        sequential = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2), keras.layers.Dense(1)])
    sequential.set_pipeline_stage_assignment([0, 1])
    sequential.set_gradient_accumulation_options(gradient_accumulation_steps_per_replica=3)
    sequential.save(str(tmp_path / "sequential.keras"))
    with strategy.scope():
        loaded = keras.saving.load_model(str(tmp_path / "sequential.keras"))
    assert [a.pipeline_stage for a in loaded.get_pipeline_stage_assignment()] == [0, 1]
    assert loaded._ipu_options.gradient_accumulation_steps_per_replica == 3
