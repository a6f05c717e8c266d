"""Ctrl-C during fit (steps_per_execution > 1) leaves every variable and
optimizer.iterations at the last completed execution, never torn."""

import signal

import keras
import numpy as np
import pytest

from keras_ipu.backend.trainer_ops import model_state
from keras_ipu.device.compiler import executable as executable_module

STEPS_PER_EXECUTION = 4
BATCH = 4


def _model(run_eagerly=False):
    keras.utils.set_random_seed(1)
    model = keras.Sequential([
        keras.Input((4,)),
        keras.layers.Dense(8, activation="relu"),
        keras.layers.Dense(3),
    ])
    model.compile(keras.optimizers.SGD(0.1, momentum=0.9), "mse",
                  steps_per_execution=STEPS_PER_EXECUTION, run_eagerly=run_eagerly)
    return model


def _data():
    rng = np.random.RandomState(0)
    return rng.rand(64, 4).astype("float32"), rng.rand(64, 3).astype("float32")


def _interrupt_inside_program(monkeypatch, at_call):
    """Ctrl-C arriving while the compiled loop runs its `at_call`-th step
    body (loop bodies run through run_unchecked)."""
    original = executable_module.Executable.run_unchecked
    calls = [0]

    def run_unchecked(self, arrays):
        calls[0] += 1
        if calls[0] == at_call:
            signal.raise_signal(signal.SIGINT)
        return original(self, arrays)

    monkeypatch.setattr(executable_module.Executable, "run_unchecked", run_unchecked)


def _interrupt_while_storing(monkeypatch, at_execution):
    """Ctrl-C arriving while the results of an execution are being stored
    in the variables."""
    original = model_state.write_state
    calls = [0]

    def write_state(variables, kinds, state, **kwargs):
        calls[0] += 1
        if calls[0] != at_execution:
            return original(variables, kinds, state, **kwargs)
        # The trainable weights are stored, the rest not yet.
        original(variables[:1], kinds[:1], state[:1], **kwargs)
        signal.raise_signal(signal.SIGINT)
        return original(variables[1:], kinds[1:], state[1:], **kwargs)

    monkeypatch.setattr(model_state, "write_state", write_state)


# Faults injected inside a program go through the NumPy engine's loop.
class _ListensToBatches(keras.callbacks.Callback):
    """fit then stores the state after every execution (no holding)."""

    def on_train_batch_end(self, batch, logs=None):
        pass


@pytest.mark.parametrize(
    "where",
    [pytest.param("inside_program", marks=pytest.mark.numpy_engine),
     "while_storing", "while_storing_held", "while_storing_eager"],
)
def test_ctrl_c_leaves_the_model_at_the_last_completed_execution(monkeypatch, where):
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        pytest.skip("SIGINT is not Python's default handler in this process")
    x, y = _data()
    eager = where.endswith("eager")
    model = _model(run_eagerly=eager)
    # Without a batch callback the compiled fit holds the state between
    # executions and stores it once, when the epoch's executions end
    # (trainer_ops/held_state.py): that store is the first.
    callbacks = [] if where == "while_storing_held" else [_ListensToBatches()]
    if where == "inside_program":
        # Calls 1, 6, 11 run the executions, the others their step bodies:
        # 13 is the 2nd step of the 3rd execution.
        _interrupt_inside_program(monkeypatch, at_call=13)
    else:
        _interrupt_while_storing(monkeypatch, at_execution=1 if where.endswith("held") else 3)
    with pytest.raises(KeyboardInterrupt):
        model.fit(x, y, batch_size=BATCH, verbose=0, shuffle=False, callbacks=callbacks)
    monkeypatch.undo()

    steps = int(model.optimizer.iterations.numpy())
    assert steps % STEPS_PER_EXECUTION == 0 and steps > 0
    reference = _model(run_eagerly=eager)
    reference.fit(x[: steps * BATCH], y[: steps * BATCH], batch_size=BATCH,
                  verbose=0, shuffle=False)
    assert int(reference.optimizer.iterations.numpy()) == steps
    for mine, theirs in zip(model.variables + model.optimizer.variables,
                            reference.variables + reference.optimizer.variables):
        np.testing.assert_allclose(np.asarray(mine), np.asarray(theirs),
                                   rtol=1e-6, atol=1e-7, err_msg=mine.path)
    # The interrupted model trains on as any other.
    model.fit(x, y, batch_size=BATCH, verbose=0, shuffle=False)
    assert int(model.optimizer.iterations.numpy()) == steps + 64 // BATCH


@pytest.mark.numpy_engine
def test_interrupt_handler_is_restored(monkeypatch):
    x, y = _data()
    seen = []
    previous = signal.signal(signal.SIGINT, lambda *a: seen.append(a))
    try:
        _interrupt_inside_program(monkeypatch, at_call=2)
        model = _model()
        model.fit(x[:16], y[:16], batch_size=BATCH, verbose=0, shuffle=False)
        assert len(seen) == 1  # the user's handler got it, once, after the execution
        assert int(model.optimizer.iterations.numpy()) == 4
        assert signal.getsignal(signal.SIGINT) is not None
        assert signal.getsignal(signal.SIGINT).__name__ == "<lambda>"
    finally:
        signal.signal(signal.SIGINT, previous)


def _default_sigint():
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        pytest.skip("SIGINT is not Python's default handler in this process")


def test_ctrl_c_while_strategy_run_stores_keras_variables_leaves_none_behind(monkeypatch):
    """IPUStrategy.run of a step that updates two variables: a Ctrl-C
    after the first is stored waits until the second is too."""
    _default_sigint()
    from keras_ipu.ipu_strategy import IPUStrategy

    strategy = IPUStrategy()
    with strategy.scope():
        a = keras.Variable(np.zeros(2, np.float32))
        b = keras.Variable(np.zeros(3, np.float32))

        def step():
            a.assign(a + 1.0)
            b.assign(b + 1.0)
            return a.value

        strategy.run(step)
        original = type(a).assign
        stored = []

        def assign(self, value):
            result = original(self, value)
            stored.append(self)
            if len(stored) == 1:
                signal.raise_signal(signal.SIGINT)
            return result

        monkeypatch.setattr(type(a), "assign", assign)
        with pytest.raises(KeyboardInterrupt):
            strategy.run(step)
    monkeypatch.undo()
    np.testing.assert_array_equal(np.array(a), np.full(2, 2.0))
    np.testing.assert_array_equal(np.array(b), np.full(3, 2.0))


def test_ctrl_c_while_a_tensorflow_function_stores_its_variables_leaves_none_behind(monkeypatch):
    """The TensorFlow front end (Graphcore's custom training loops): a
    Ctrl-C as a run's variable updates are being stored waits until every
    update of that run is."""
    _default_sigint()
    tf = pytest.importorskip("tensorflow")
    from keras_ipu.frontends.tensorflow import captured_variables
    from keras_ipu.frontends.tensorflow import function as bridge

    w = tf.Variable(np.zeros(2, np.float32))
    v = tf.Variable(np.zeros(3, np.float32))

    @tf.function(jit_compile=True)
    def step():
        w.assign_add(tf.ones(2))
        v.assign_add(tf.ones(3))
        return w * 1.0

    bridged = bridge.BridgedFunction(step)
    bridged()
    # The updated variables are stored by one TensorFlow call
    # (captured_variables.CapturedInputs.write); the Ctrl-C arrives just
    # before it starts, so without the deferral nothing would be stored.
    original = captured_variables.CapturedInputs.write
    stored = []

    def write(self, positions, values):
        signal.raise_signal(signal.SIGINT)
        original(self, positions, values)
        stored.extend(positions)

    monkeypatch.setattr(captured_variables.CapturedInputs, "write", write)
    with pytest.raises(KeyboardInterrupt):
        bridged()
    monkeypatch.undo()
    assert len(stored) == 2
    np.testing.assert_array_equal(w.numpy(), np.full(2, 2.0))
    np.testing.assert_array_equal(v.numpy(), np.full(3, 2.0))
