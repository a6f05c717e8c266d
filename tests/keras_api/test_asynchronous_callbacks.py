"""set_asynchronous_callbacks(True): the batch callbacks of fit and
evaluate run for every step of an execution, with that step's logs."""

import keras
import numpy as np
import pytest

import keras_ipu as ipu

from ipu_keras_helpers import configure
from ipu_keras_helpers import mlp
from ipu_keras_helpers import regression_data


class Record(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.train, self.test, self.begins = [], [], []

    def on_train_batch_begin(self, batch, logs=None):
        self.begins.append(batch)

    def on_train_batch_end(self, batch, logs=None):
        self.train.append((batch, float(logs["loss"])))

    def on_test_batch_end(self, batch, logs=None):
        self.test.append((batch, float(logs["loss"])))


def train(steps_per_execution, asynchronous, accumulation=None):
    configure(1)
    x, y = regression_data(64)
    strategy = ipu.ipu_strategy.IPUStrategy()
    with strategy.scope():
        keras.utils.set_random_seed(1)
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4, activation="relu"),
                                  keras.layers.Dense(1)])
        model.compile(keras.optimizers.SGD(0.05), "mse", steps_per_execution=steps_per_execution)
        if accumulation:
            model.set_gradient_accumulation_options(
                gradient_accumulation_steps_per_replica=accumulation)
        model.set_asynchronous_callbacks(asynchronous)
        record = Record()
        model.fit(x, y, batch_size=8, epochs=1, verbose=0, shuffle=False, callbacks=[record])
        model.evaluate(x, y, batch_size=8, verbose=0, callbacks=[record])
    return record


@pytest.mark.parametrize("accumulation", [None, 2])
def test_every_step_gets_its_own_callbacks_and_logs(accumulation):
    # The reference: the shortest execution allowed (one step; with
    # accumulation one optimizer step of 2, its two steps' logs asked for).
    reference = train(accumulation or 1, bool(accumulation), accumulation)
    once = train(4, False, accumulation)
    every = train(4, True, accumulation)
    # Without: once per execution of 4 steps, at its last step.
    assert [b for b, _ in once.train] == [3, 7] and once.begins == [0, 4]
    # With: every step, begin and end, and the logs of that step, which
    # equal those of the shortest executions.
    assert every.begins == list(range(8))
    assert [b for b, _ in every.train] == list(range(8))
    np.testing.assert_allclose([l for _, l in every.train], [l for _, l in reference.train],
                               rtol=1e-6)
    assert [b for b, _ in every.test] == list(range(8))
    np.testing.assert_allclose([l for _, l in every.test], [l for _, l in reference.test],
                               rtol=1e-6)


def pipelined(accumulate_outfeed, asynchronous):
    """A two-stage pipeline, one execution of 8 micro-batches (two optimizer
    steps of 4) in fit and in evaluate."""
    configure(2)
    x, y = regression_data(64)
    model = mlp(ipu.ipu_strategy.IPUStrategy(), stages=[0, None, 1])
    model.compile(keras.optimizers.SGD(0.05), "mse", steps_per_execution=8)
    model.set_pipelining_options(gradient_accumulation_steps_per_replica=4,
                                 accumulate_outfeed=accumulate_outfeed)
    model.set_asynchronous_callbacks(asynchronous)
    record = Record()
    model.fit(x, y, batch_size=8, epochs=1, verbose=0, shuffle=False, callbacks=[record])
    model.evaluate(x, y, batch_size=8, verbose=0, callbacks=[record])
    return record


def test_accumulate_outfeed_gives_the_mean_of_an_optimizer_step_and_ignores_asynchronous():
    every = pipelined(False, True)
    assert [b for b, _ in every.train] == list(range(8))
    accumulated = pipelined(True, True)
    # One callback per execution (Graphcore ignores asynchronous callbacks
    # with accumulate_outfeed): fit's logs are the mean of the last
    # optimizer step's 4 micro-batches, evaluate's of all 8 steps.
    assert accumulated.begins == [0]
    ((batch, loss),) = accumulated.train
    assert batch == 7
    np.testing.assert_allclose(loss, np.mean([l for _, l in every.train[4:]]), rtol=1e-6)
    ((batch, loss),) = accumulated.test
    assert batch == 7
    np.testing.assert_allclose(loss, np.mean([l for _, l in every.test]), rtol=1e-6)
