"""fit keeps the train state out of the variables between executions when
no callback listens to its batches (trainer_ops/held_state.py): the same
bits as writing it after every execution, and the variables hold it
wherever anything can look."""

import keras
import numpy as np
import pytest

from keras_ipu.backend.trainer_ops.device_loop import DeviceLoop


def _model(optimizer="adam"):
    keras.utils.set_random_seed(5)
    model = keras.Sequential([
        keras.Input((12,)),
        keras.layers.Dense(16, activation="relu"),
        keras.layers.BatchNormalization(),  # non-trainable state too
        keras.layers.Dropout(0.2),  # the seed state advances every step
        keras.layers.Dense(3),
    ])
    model.compile(optimizer, keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    return model


def _data(n=100):
    rng = np.random.default_rng(1)
    return rng.random((n, 12), dtype=np.float32), rng.integers(0, 3, n)


class Listens(keras.callbacks.Callback):
    """A batch-level callback: fit writes the state after every execution."""

    def on_train_batch_end(self, batch, logs=None):
        pass


class Weights(keras.callbacks.Callback):
    """What an epoch-level callback sees at each epoch's end."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def on_epoch_end(self, epoch, logs=None):
        self.seen.append([np.array(w) for w in self.model.get_weights()])


def _held_runs(monkeypatch):
    """Counts the executions run on the held state (run_held's, not None)."""
    ran = []
    original = DeviceLoop.run_held

    def counted(self, held, batches):
        chunks = original(self, held, batches)
        ran.append(chunks is not None)
        return chunks

    monkeypatch.setattr(DeviceLoop, "run_held", counted)
    return ran


@pytest.mark.parametrize("steps_per_execution", [1, 3])
def test_held_state_gives_the_same_bits_as_writing_it_each_execution(
        monkeypatch, steps_per_execution):
    x, y = _data()  # 100 samples, batch 16: a smaller last batch, a new program
    ran = _held_runs(monkeypatch)
    held, written = _model(), _model()
    for model in (held, written):
        model.compile(model.optimizer, model.loss, metrics=["accuracy"],
                      steps_per_execution=steps_per_execution)
    seen_held, seen_written = Weights(), Weights()
    a = held.fit(x, y, batch_size=16, epochs=3, verbose=0, shuffle=False,
                 callbacks=[seen_held])
    executions = len(ran)
    b = written.fit(x, y, batch_size=16, epochs=3, verbose=0, shuffle=False,
                    callbacks=[seen_written, Listens()])
    # The held path ran (all but each epoch's first execution); the
    # listening fit never held.
    assert len(ran) == executions
    per_epoch = -(-7 // steps_per_execution)
    assert executions == 3 * (per_epoch - 1) and sum(ran) >= 3 * (per_epoch - 2)
    assert a.history == b.history
    for u, v in zip(held.get_weights(), written.get_weights()):
        assert np.array_equal(u, v)
    for u, v in zip(held.optimizer.variables, written.optimizer.variables):
        assert np.array_equal(u, v)
    # Each epoch's end saw the state of that epoch's last step.
    for epoch_a, epoch_b in zip(seen_held.seen, seen_written.seen, strict=True):
        for u, v in zip(epoch_a, epoch_b):
            assert np.array_equal(u, v)


def test_an_error_mid_epoch_leaves_the_steps_that_ran_in_the_variables():
    x, y = _data(64)

    def batches():
        for i in range(3):
            yield x[16 * i:16 * (i + 1)], y[16 * i:16 * (i + 1)]
        raise RuntimeError("the input broke")

    model, reference = _model("sgd"), _model("sgd")
    with pytest.raises(RuntimeError, match="the input broke"):
        model.fit(batches(), epochs=1, verbose=0)
    for i in range(3):
        reference.train_on_batch(x[16 * i:16 * (i + 1)], y[16 * i:16 * (i + 1)])
    for u, v in zip(model.get_weights(), reference.get_weights()):
        assert np.array_equal(u, v)
    assert int(model.optimizer.iterations.numpy()) == 3


class MyProgbar(keras.callbacks.ProgbarLogger):
    """A subclass may read the model in its hooks: no holding."""


@pytest.mark.parametrize("callbacks, holds", [
    ([], True), ([MyProgbar()], False), ([Listens()], False)],
    ids=["progress bar", "progress bar subclass", "batch callback"])
def test_the_progress_bar_alone_lets_fit_hold_the_state(monkeypatch, capsys, callbacks, holds):
    x, y = _data(64)
    ran = _held_runs(monkeypatch)
    held, written = _model(), _model()
    held.fit(x, y, batch_size=16, epochs=2, verbose=1, shuffle=False, callbacks=callbacks)
    assert bool(ran) == holds and all(ran)
    assert "4/4" in capsys.readouterr().out  # the bar still counts every step
    written.fit(x, y, batch_size=16, epochs=2, verbose=0, shuffle=False, callbacks=[Listens()])
    for u, v in zip(held.get_weights(), written.get_weights()):
        assert np.array_equal(u, v)


class ListensToTests(keras.callbacks.Callback):
    def on_test_batch_end(self, batch, logs=None):
        pass


class ListensToPredictions(keras.callbacks.Callback):
    def on_predict_batch_begin(self, batch, logs=None):
        pass


def _trained():
    x, y = _data()
    model = _model()
    model.fit(x, y, batch_size=16, epochs=1, verbose=0, shuffle=False)
    return model


@pytest.mark.parametrize("steps_per_execution", [1, 3])
def test_evaluate_holds_its_state_with_the_same_results(monkeypatch, steps_per_execution):
    x, y = _data()  # 7 batches of 16, the last of 4
    model = _trained()
    model.compile(model.optimizer, model.loss, metrics=["accuracy"],
                  steps_per_execution=steps_per_execution)
    weights = [np.array(w) for w in model.get_weights()]
    ran = _held_runs(monkeypatch)
    held = model.evaluate(x, y, batch_size=16, verbose=0, return_dict=True)
    executions = len(ran)
    per_epoch = -(-7 // steps_per_execution)
    assert executions == per_epoch - 1 and sum(ran) >= per_epoch - 2 and any(ran)
    held_metrics = [np.array(v) for v in model.metrics_variables]
    written = model.evaluate(x, y, batch_size=16, verbose=0, return_dict=True,
                             callbacks=[ListensToTests()])
    assert len(ran) == executions  # a test batch callback: written each time
    assert held == written
    # The metrics' variables hold the last step's state when evaluate returns.
    for u, v in zip(held_metrics, model.metrics_variables):
        assert np.array_equal(u, v)
    for u, v in zip(weights, model.get_weights()):  # evaluate changes no weight
        assert np.array_equal(u, v)


def test_fit_validates_on_held_state():
    x, y = _data()
    held, written = _model(), _model()
    a = held.fit(x, y, batch_size=16, epochs=2, verbose=0, shuffle=False,
                 validation_data=(x[:40], y[:40]))
    b = written.fit(x, y, batch_size=16, epochs=2, verbose=0, shuffle=False,
                    validation_data=(x[:40], y[:40]), callbacks=[Listens(), ListensToTests()])
    assert a.history == b.history and "val_loss" in a.history


def test_predict_holds_its_state_with_the_same_outputs(monkeypatch):
    x, _ = _data()
    model = _trained()
    ran = _held_runs(monkeypatch)
    held = model.predict(x, batch_size=16, verbose=0)
    assert len(ran) == 6 and any(ran)  # 7 executions, the first reads the variables
    written = model.predict(x, batch_size=16, verbose=0, callbacks=[ListensToPredictions()])
    assert len(ran) == 6
    assert held.shape == (100, 3) and np.array_equal(held, written)
    # The variables are whole afterwards: a step on them gives the same.
    assert np.array_equal(model.predict_on_batch(x[:16]), held[:16])
