"""The SDK 2.1 classes: ipu.keras.Model, Sequential, PipelineModel,
PipelineSequential, fit/evaluate/predict with steps_per_run and their
messages."""

import keras
import numpy as np
import pytest

import keras_ipu as ipu
from keras_ipu.device.config import system_config

from ipu_keras_helpers import configure
from ipu_keras_helpers import max_weight_difference
from ipu_keras_helpers import regression_data


def layers(seed):
    keras.utils.set_random_seed(seed)
    return [keras.layers.Dense(8, activation="relu"), keras.layers.Dense(1)]


def test_pipeline_sequential_trains_as_accumulation():
    configure(2)
    x, y = regression_data(n=64)
    strategy = ipu.ipu_strategy.IPUStrategy()
    with strategy.scope():
        a, b = layers(4)
        pipelined = ipu.keras.PipelineSequential([[a], [b]], gradient_accumulation_count=4)
        pipelined.compile(keras.optimizers.SGD(0.05), "mse")
        pipelined.fit(x, y, batch_size=4, epochs=2, steps_per_run=2, verbose=0)
        assert pipelined.replication_factor == 1
        accumulated = ipu.keras.Sequential(layers(4), gradient_accumulation_count=4)
        accumulated.compile(keras.optimizers.SGD(0.05), "mse")
        accumulated.fit(x, y, batch_size=4, epochs=2, steps_per_run=2, verbose=0)
        assert accumulated.replication_factor == 2
    # The same weights from 2 replicas of 8 and 1 pipeline of 16 micro-batches
    # differ; compare the pipeline with one replica.
    system_config.reset_ipu_configuration()
    with strategy.scope():
        single = ipu.keras.Sequential(layers(4), gradient_accumulation_count=4)
        single.compile(keras.optimizers.SGD(0.05), "mse")
        single.fit(x, y, batch_size=4, epochs=2, steps_per_run=2, verbose=0)
        assert single.evaluate(x, y, batch_size=4, verbose=0) > 0
        assert single.predict(x, batch_size=4).shape == (64, 1)
    assert max_weight_difference(pipelined, single) < 1e-6


def test_pipeline_model_from_pipeline_stages():
    configure(2)
    x, y = regression_data(n=32)
    strategy = ipu.ipu_strategy.IPUStrategy()
    with strategy.scope():
        inputs = keras.Input((8,))
        with ipu.keras.PipelineStage(0):
            h = keras.layers.Dense(8, activation="relu")(inputs)
        with ipu.keras.PipelineStage(1):
            out = keras.layers.Dense(1)(h)
        model = ipu.keras.PipelineModel(inputs, out, gradient_accumulation_count=4)
        assert model.stages == [0, 1]
        model.compile("sgd", "mse")
        history = model.fit(x, y, batch_size=4, verbose=0)
        assert len(history.history["loss"]) == 1
        plain_in = keras.Input((8,))
        plain = keras.layers.Dense(1)(plain_in)
        with pytest.raises(ValueError, match="All layers of a pipelined model must have an "
                           "associated pipeline stage"):
            ipu.keras.PipelineModel(plain_in, plain, gradient_accumulation_count=4)


def test_constructor_checks():
    strategy = ipu.ipu_strategy.IPUStrategy()
    with strategy.scope():
        with pytest.raises(ValueError, match="An IPU pipeline must take a non-empty list of stages"):
            ipu.keras.PipelineSequential([], gradient_accumulation_count=2)
        with pytest.raises(ValueError, match="An IPU pipeline may only contain lists of stages"):
            ipu.keras.PipelineSequential([keras.layers.Dense(1)], gradient_accumulation_count=2)
        with pytest.raises(ValueError, match="Each list in the `stages` list must contain only Keras Layers"):
            ipu.keras.PipelineSequential([[1]], gradient_accumulation_count=2)
        with pytest.raises(ValueError, match="IPU Sequential requires a list of Layers"):
            ipu.keras.Sequential(keras.layers.Dense(1))
        with pytest.raises(ValueError, match="Model was not provided with 'inputs' and 'outputs'"):
            ipu.keras.Model(keras.Input((2,)))
        with pytest.raises(NotImplementedError, match="Batch serialization is only supported with "
                           "the `Sequential` schedule"):
            ipu.keras.PipelineSequential([[keras.layers.Dense(1)], [keras.layers.Dense(1)]],
                                         gradient_accumulation_count=2,
                                         batch_serialization_iterations=2)


def test_batch_serialization_runs_all_stages_on_one_ipu_holding_its_slices():
    """PipelineSequential(batch_serialization_iterations=2): the stages on
    IPU 0 (Graphcore's default), the weights of accumulation over count x 2
    micro-batches, and the prediction of the Sequential pipeline of as many
    micro-batches with the stash of 2 held at once."""
    from keras_ipu.models.prediction import predict_training

    sequential = ipu.ops.pipelining_ops.PipelineSchedule.Sequential
    x, y = regression_data(n=32)
    strategy = ipu.ipu_strategy.IPUStrategy()
    with strategy.scope():
        with pytest.raises(NotImplementedError, match="all the pipeline stages need to be "
                           "mapped to a single IPU"):
            ipu.keras.PipelineSequential([[keras.layers.Dense(1)], [keras.layers.Dense(1)]],
                                         gradient_accumulation_count=2, device_mapping=[0, 1],
                                         batch_serialization_iterations=2,
                                         pipeline_schedule=sequential)
        serial = ipu.keras.PipelineSequential(
            [[a] for a in layers(5)], gradient_accumulation_count=2,
            batch_serialization_iterations=2, pipeline_schedule=sequential)
        plain = ipu.keras.PipelineSequential(
            [[a] for a in layers(5)], gradient_accumulation_count=4, device_mapping=[0, 0],
            pipeline_schedule=sequential)
        for model in (serial, plain):
            model.compile(keras.optimizers.SGD(0.05), "mse")
            model.fit(x, y, batch_size=4, epochs=1, verbose=0)
        assert max_weight_difference(serial, plain) < 1e-6
        held, one = predict_training(serial, 4).sharded, predict_training(plain, 4).sharded
    assert [p.ipu for p in held.ipus] == [p.ipu for p in one.ipus] == [0]
    assert held.step_cycles == one.step_cycles
    assert (held.ipus[0].in_flight, one.ipus[0].in_flight) == (2, 1)
    assert (held.ipus[0].memory.not_always_live_bytes
            - one.ipus[0].memory.not_always_live_bytes) == held.ipus[0].stash_bytes > 0


def test_fit_arguments_and_steps_rules():
    import tensorflow as tf

    configure(2)
    x, y = regression_data(n=40)
    strategy = ipu.ipu_strategy.IPUStrategy()
    with strategy.scope():
        model = ipu.keras.Sequential(layers(1), gradient_accumulation_count=2)
        model.compile("sgd", "mse")
        with pytest.raises(NotImplementedError, match="IPU Keras models do not support these "
                           "parameters to fit\\(\\): validation_split"):
            model.fit(x, y, batch_size=4, validation_split=0.5, verbose=0)
        dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(4, drop_remainder=True)
        with pytest.raises(ValueError, match=r"Do not specify `batch_size` in Sequential.fit\(\)"):
            model.fit(dataset, batch_size=4, verbose=0)
        with pytest.raises(ValueError, match=r"Sequential requires the number of steps in an epoch "
                           r"'steps_per_epoch' \(3\) to be evenly divisible by the replication "
                           r"factor \(2\)"):
            model.fit(dataset.repeat(), steps_per_epoch=3, verbose=0)
        with pytest.raises(ValueError, match=r"'steps_per_run' \(2\) multiplied by the replication "
                           r"factor \(2\)"):
            model.fit(dataset.repeat(), steps_per_epoch=2, steps_per_run=2, verbose=0)
        with pytest.raises(ValueError, match="When using an infinitely repeating dataset, you must "
                           "provide the number of steps per epoch"):
            model.fit(dataset.repeat(), verbose=0)
        with pytest.raises(ValueError, match=r"must be at least the gradient accumulation count "
                           r"\(2\) multiplied by the replication factor \(2\)"):
            model.fit(x[:12], y[:12], batch_size=4, verbose=0)
        history = model.fit(dataset.repeat(), steps_per_epoch=4, steps_per_run=1, verbose=0,
                            prefetch_depth=2)
        assert len(history.history["loss"]) == 1
        assert model._ipu_options.prefetch_depth == 2
        with pytest.raises(ValueError, match="can only be called through the `fit`, `evaluate` "
                           "or `predict` interfaces"):
            model(x)
        with pytest.raises(NotImplementedError, match="do not support the `save` interface"):
            model.save("model.keras")


def test_deprecated_argument_names_warn(caplog):
    strategy = ipu.ipu_strategy.IPUStrategy()
    with strategy.scope():
        model = ipu.keras.Sequential(layers(0), accumulation_count=2)
    assert model.gradient_accumulation_count == 2
    assert "Argument 'accumulation_count' is deprecated, use 'gradient_accumulation_count'" in caplog.text
    with strategy.scope():
        with pytest.raises(ValueError, match="cannot be used together"):
            ipu.keras.Sequential(layers(0), accumulation_count=2, gradient_accumulation_count=4)

