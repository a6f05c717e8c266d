"""Training on the ipu backend: fit and train_on_batch with a compiled,
stateless train step and a device loop of steps_per_execution steps.

The referee at the end trains the same CNN from the same weights on the
same data under KERAS_BACKEND=tensorflow (this file run as a script in a
subprocess):

    KERAS_BACKEND=tensorflow python tests/models/test_training.py WORKDIR
"""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np

REFEREE_STEPS = 20
REFEREE_BATCH = 8
REFEREE_LR = 0.05


# --------------------------------------------------------------------------
# Shared with the TensorFlow subprocess (no pytest, no ipu-only imports)


def referee_cnn(keras):
    return keras.Sequential(
        [
            keras.Input((10, 10, 3)),
            keras.layers.Conv2D(6, 3, padding="same", activation="relu"),
            keras.layers.BatchNormalization(),
            keras.layers.MaxPooling2D(2),
            keras.layers.Conv2D(8, 3, padding="valid", activation="relu"),
            keras.layers.Flatten(),
            keras.layers.Dense(4),
        ]
    )


def referee_compile(model, keras):
    model.compile(
        optimizer=keras.optimizers.SGD(learning_rate=REFEREE_LR),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )


def referee_train(model, x, y):
    """Per-step losses of REFEREE_STEPS train_on_batch calls, then the
    weights (trainable and BatchNormalization statistics)."""
    losses = []
    for i in range(REFEREE_STEPS):
        batch = slice(i * REFEREE_BATCH, (i + 1) * REFEREE_BATCH)
        losses.append(model.train_on_batch(x[batch], y[batch])[0])
    return np.array(losses), [np.asarray(w) for w in model.get_weights()]


def write_tensorflow_reference(workdir):
    import keras

    workdir = Path(workdir)
    with np.load(workdir / "data.npz") as f:
        x, y = f["x"], f["y"]
    model = referee_cnn(keras)
    model.load_weights(workdir / "model.weights.h5")
    referee_compile(model, keras)
    losses, weights = referee_train(model, x, y)
    np.savez(
        workdir / "reference.npz",
        losses=losses,
        **{f"w{i}": w for i, w in enumerate(weights)},
    )


if __name__ == "__main__":
    write_tensorflow_reference(sys.argv[1])
    sys.exit(0)


# --------------------------------------------------------------------------
# The tests (KERAS_BACKEND=ipu, set by tests/conftest.py)

import pytest  # noqa: E402

import keras  # noqa: E402


def classification_data(n=256, features=20, classes=3, seed=0):
    """Separable synthetic classes: labels from a random linear map."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, features)).astype("float32")
    w = rng.normal(size=(features, classes)).astype("float32")
    y = np.argmax(x @ w, axis=1).astype("int32")
    return x, y


def mlp(dropout=0.0, seed=1):
    keras.utils.set_random_seed(seed)
    layers = [keras.Input((20,)), keras.layers.Dense(32, activation="relu")]
    if dropout:
        layers.append(keras.layers.Dropout(dropout))
    layers.append(keras.layers.Dense(3))
    return keras.Sequential(layers)


def compile_sgd(model, steps_per_execution=1, run_eagerly=False, lr=0.1):
    model.compile(
        optimizer=keras.optimizers.SGD(learning_rate=lr),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
        steps_per_execution=steps_per_execution,
        run_eagerly=run_eagerly,
    )
    return model


def weights_of(model):
    return [keras.ops.convert_to_numpy(v) for v in model.weights]


@pytest.mark.parametrize("run_eagerly", [False, True], ids=["compiled", "eager"])
def test_mlp_learns(run_eagerly):
    x, y = classification_data()
    model = compile_sgd(mlp(), steps_per_execution=4, run_eagerly=run_eagerly)
    before = model.evaluate(x, y, verbose=0, return_dict=True)
    history = model.fit(x, y, batch_size=32, epochs=5, verbose=0)
    losses = history.history["loss"]
    accuracy = history.history["accuracy"]
    assert len(losses) == 5
    assert losses[-1] < 0.6 * losses[0]
    assert accuracy[-1] > accuracy[0]
    after = model.evaluate(x, y, verbose=0, return_dict=True)
    assert after["loss"] < before["loss"]
    assert after["accuracy"] > 0.8
    assert int(keras.ops.convert_to_numpy(model.optimizer.iterations)) == 5 * 8


def test_train_on_batch_returns_the_loss_and_takes_one_sgd_step():
    # A linear model with MSE: the loss and the SGD update by hand.
    rng = np.random.default_rng(3)
    x = rng.normal(size=(6, 4)).astype("float32")
    y = rng.normal(size=(6, 2)).astype("float32")
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    w0 = rng.normal(size=(4, 2)).astype("float32")
    b0 = rng.normal(size=(2,)).astype("float32")
    model.set_weights([w0, b0])
    lr = 0.1
    model.compile(optimizer=keras.optimizers.SGD(lr), loss="mse")

    loss = model.train_on_batch(x, y)

    error = x @ w0 + b0 - y
    np.testing.assert_allclose(loss, np.mean(error**2), rtol=1e-5)
    grad = 2.0 * error / error.size
    w1, b1 = model.get_weights()
    np.testing.assert_allclose(w1, w0 - lr * x.T @ grad, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(b1, b0 - lr * grad.sum(0), rtol=1e-5, atol=1e-6)
    logs = model.train_on_batch(x, y, return_dict=True)
    assert set(logs) == {"loss"} and logs["loss"] < loss


def test_steps_per_execution_gives_the_same_weights():
    x, y = classification_data(n=200)  # 7 batches of 32: 6 full, 1 of 8
    results = []
    for steps_per_execution, run_eagerly in [(1, False), (4, False), (3, True)]:
        model = compile_sgd(
            mlp(seed=5), steps_per_execution, run_eagerly=run_eagerly
        )
        history = model.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0)
        results.append((weights_of(model), history.history["loss"]))
    (w_ref, loss_ref), *others = results
    for w, loss in others:
        for a, b in zip(w, w_ref):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(loss, loss_ref, rtol=1e-5)


class RecordBatches(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        self.model_weights = getattr(self, "model_weights", [])
        self.model_weights.append(weights_of(self.model))
        self.batches = getattr(self, "batches", []) + [batch]


def test_one_execution_is_one_compiled_loop_and_callbacks_see_its_weights():
    x, y = classification_data(n=256)
    model = compile_sgd(mlp(), steps_per_execution=4)
    record = RecordBatches()
    model.fit(x, y, batch_size=32, epochs=1, verbose=0, callbacks=[record])
    # 8 batches in 2 executions of 4 steps: one executable, traced once.
    assert record.batches == [3, 7]
    loops = model.train_function.device_loop._loops
    assert len(loops) == 1
    (loop,) = loops.values()
    assert loop.trace_count == 1
    # The weights the callback saw after the first execution are those of
    # four single steps.
    reference = compile_sgd(mlp(), steps_per_execution=1)
    reference.fit(x[:128], y[:128], batch_size=32, shuffle=False, verbose=0)
    model2 = compile_sgd(mlp(), steps_per_execution=4)
    record2 = RecordBatches()
    model2.fit(
        x, y, batch_size=32, shuffle=False, verbose=0, callbacks=[record2]
    )
    for a, b in zip(record2.model_weights[0], weights_of(reference)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


class EpochsOnly(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        self.logs = logs


class OldBatchHook(keras.callbacks.Callback):
    # Keras' default on_train_batch_end forwards to on_batch_end.
    def on_batch_end(self, batch, logs=None):
        self.batches = getattr(self, "batches", []) + [batch]


def test_batch_callbacks_are_called_only_when_a_callback_has_one(monkeypatch):
    from keras.src.callbacks.callback_list import CallbackList

    calls = []
    for hook in ("on_train_batch_begin", "on_train_batch_end",
                 "on_test_batch_begin", "on_test_batch_end"):
        original = getattr(CallbackList, hook)
        monkeypatch.setattr(
            CallbackList, hook,
            lambda self, batch, logs=None, _h=hook, _o=original: (
                calls.append(_h), _o(self, batch, logs))[1])
    x, y = classification_data(n=128)
    epochs = EpochsOnly()
    model = compile_sgd(mlp())
    history = model.fit(x, y, batch_size=32, epochs=2, verbose=0, callbacks=[epochs],
                        validation_data=(x, y))
    # verbose=0, History and an epoch callback: no batch hook does anything,
    # so none is called; epoch logs and validation are as before.
    assert calls == []
    assert epochs.logs["loss"] == history.history["loss"][-1]
    assert set(epochs.logs) == {"loss", "accuracy", "val_loss", "val_accuracy"}
    model.evaluate(x, y, verbose=0)
    assert calls == []
    old = OldBatchHook()
    model.fit(x, y, batch_size=32, epochs=1, verbose=0, callbacks=[old])
    assert old.batches == [0, 1, 2, 3]
    assert calls.count("on_train_batch_end") == 4 and "on_test_batch_end" not in calls
    calls.clear()
    model.evaluate(x, y, verbose=0, callbacks=[RecordTestBatches()])
    assert calls.count("on_test_batch_end") == 4
    calls.clear()
    model.evaluate(x, y, verbose=1)  # the progress bar listens
    assert calls.count("on_test_batch_end") == 4


class RecordTestBatches(keras.callbacks.Callback):
    def on_test_batch_end(self, batch, logs=None):
        pass


@pytest.mark.parametrize("run_eagerly", [False, True], ids=["compiled", "eager"])
def test_dropout_differs_between_steps(run_eagerly):
    x, y = classification_data(n=32)
    # learning rate 0: the weights stay, only the dropout masks can change.
    model = compile_sgd(mlp(dropout=0.5), run_eagerly=run_eagerly, lr=0.0)
    seed_state = [v for v in model.non_trainable_variables if "seed" in v.path]
    assert seed_state, [v.path for v in model.non_trainable_variables]
    seeds_before = keras.ops.convert_to_numpy(seed_state[0])
    losses = [model.train_on_batch(x, y)[0] for _ in range(3)]
    assert len(set(losses)) == 3, losses
    seeds_after = keras.ops.convert_to_numpy(seed_state[0])
    assert not np.array_equal(seeds_before, seeds_after)
    # Inside one execution of several steps too: the running mean of the
    # loss moves although data and weights are the same at every step.
    model = compile_sgd(mlp(dropout=0.5), steps_per_execution=4, lr=0.0)
    history = model.fit(
        np.concatenate([x] * 4), np.concatenate([y] * 4), batch_size=32,
        epochs=2, verbose=0,
    )
    assert history.history["loss"][0] != history.history["loss"][1]
    # Without training=True there is no dropout: evaluate is deterministic.
    first = model.evaluate(x, y, verbose=0)
    assert model.evaluate(x, y, verbose=0) == first


def test_adam_and_validation_data():
    x, y = classification_data()
    model = mlp()
    model.compile(
        optimizer=keras.optimizers.Adam(1e-2),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
        steps_per_execution=2,
    )
    history = model.fit(
        x, y, batch_size=32, epochs=3, verbose=0, validation_split=0.25
    )
    assert set(history.history) == {
        "loss", "accuracy", "val_loss", "val_accuracy"
    }
    assert history.history["loss"][-1] < history.history["loss"][0]
    assert history.history["val_loss"][-1] < history.history["val_loss"][0]


def test_cnn_training_matches_tensorflow(tmp_path):
    rng = np.random.default_rng(7)
    n = REFEREE_STEPS * REFEREE_BATCH
    x = rng.normal(size=(n, 10, 10, 3)).astype("float32")
    y = rng.integers(0, 4, size=(n,)).astype("int32")
    keras.utils.set_random_seed(11)
    model = referee_cnn(keras)
    model.save_weights(tmp_path / "model.weights.h5")
    np.savez(tmp_path / "data.npz", x=x, y=y)

    env = dict(os.environ, KERAS_BACKEND="tensorflow", TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.Popen(
        [sys.executable, __file__, str(tmp_path)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    referee_compile(model, keras)
    losses, weights = referee_train(model, x, y)

    # fit with 5 steps per execution over the same 20 batches.
    fitted = referee_cnn(keras)
    fitted.load_weights(tmp_path / "model.weights.h5")
    referee_compile(fitted, keras)
    fitted.compile(
        optimizer=keras.optimizers.SGD(learning_rate=REFEREE_LR),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        steps_per_execution=5,
    )
    fitted.fit(x, y, batch_size=REFEREE_BATCH, shuffle=False, verbose=0)

    _, stderr = proc.communicate(timeout=900)
    if proc.returncode != 0:
        pytest.fail(f"TensorFlow reference run failed:\n{stderr[-6000:]}")
    with np.load(tmp_path / "reference.npz") as f:
        ref_losses = f["losses"]
        ref_weights = [f[f"w{i}"] for i in range(len(weights))]

    assert losses[-1] < losses[0]  # it learns (the labels are random)
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-4)
    for ours, theirs in zip(weights, ref_weights):
        np.testing.assert_allclose(ours, theirs, rtol=1e-3, atol=1e-5)
    for ours, theirs in zip(fitted.get_weights(), ref_weights):
        np.testing.assert_allclose(ours, theirs, rtol=1e-3, atol=1e-5)


def _ipu_optimizer(base, *args, **kwargs):
    """`base` with the ipu backend's optimizer logic, whether or not the
    import hook already makes every Keras optimizer an IPUOptimizer."""
    from keras_ipu.backend.trainer_ops.optimizer import IPUOptimizer

    if not issubclass(base, IPUOptimizer):
        base = type("IPU" + base.__name__, (IPUOptimizer, base), {})
    return base(*args, **kwargs)


@pytest.mark.parametrize(
    "options",
    [
        {"gradient_accumulation_steps": 2},
        {"gradient_accumulation_steps": 3, "clipnorm": 0.1},
        {"use_ema": True, "ema_overwrite_frequency": 3},
    ],
    ids=["accumulate2", "accumulate3_clip", "ema_overwrite"],
)
def test_optimizer_branches_compile(options):
    # Gradient accumulation and EMA overwrites branch on the step number;
    # compiled, they must give the numbers of Keras' generic eager code.
    rng = np.random.default_rng(4)
    x = rng.normal(size=(48, 5)).astype("float32")
    y = rng.normal(size=(48, 3)).astype("float32")
    results = []
    for optimizer, run_eagerly in [
        (_ipu_optimizer(keras.optimizers.Adam, 0.05, **options), False),
        (keras.optimizers.Adam(0.05, **options), True),
    ]:
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(3)])
        model.compile(
            optimizer=optimizer, loss="mse", run_eagerly=run_eagerly,
            steps_per_execution=2,
        )
        initial = weights_of(model)
        model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
        results.append(weights_of(model))
    for a, b, w0 in zip(*results, initial):
        assert not np.array_equal(a, w0)
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_compiled_inference_equals_eager():
    x, y = classification_data(n=100)
    outputs = []
    for run_eagerly in (False, True):
        model = compile_sgd(mlp(dropout=0.3), steps_per_execution=3,
                            run_eagerly=run_eagerly)
        outputs.append(
            (
                model.predict(x, batch_size=16, verbose=0),
                model.evaluate(x, y, batch_size=16, verbose=0),
            )
        )
    (p1, e1), (p2, e2) = outputs
    np.testing.assert_allclose(p1, p2, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(e1, e2, rtol=1e-5)


def test_a_stateful_train_step_gets_the_stateless_signature_in_the_error():
    class StatefulStep(keras.Sequential):
        def train_step(self, data):  # the TensorFlow/torch backends' form
            return {}

    model = StatefulStep([keras.Input((20,)), keras.layers.Dense(3)])
    compile_sgd(model)
    x, y = classification_data(n=8)
    with pytest.raises(TypeError, match=r"train_step\(self, state, data\)"):
        model.fit(x, y, verbose=0)


def test_custom_stateless_train_step():
    class CountingStep(keras.Sequential):
        def train_step(self, state, data):
            logs, state = super().train_step(state, data)
            logs["custom"] = 7.0
            return logs, state

    model = compile_sgd(
        CountingStep([keras.Input((20,)), keras.layers.Dense(3)]),
        steps_per_execution=2,
    )
    x, y = classification_data(n=64)
    history = model.fit(x, y, batch_size=16, verbose=0)
    assert history.history["custom"] == [7.0]
    assert history.history["loss"][0] > 0


def test_mixed_float16_trains_with_loss_scaling_compiled_as_eager():
    """mixed_float16: float16 compute, float32 weights, and compile() wraps
    the optimizer in a LossScaleOptimizer; the compiled device loop gives
    the weights eager execution gives."""
    x, y = classification_data()
    results = []
    try:
        keras.config.set_dtype_policy("mixed_float16")
        for run_eagerly in (False, True):
            model = mlp(seed=3)
            model.compile(
                optimizer=keras.optimizers.SGD(learning_rate=0.1),
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                steps_per_execution=4,
                run_eagerly=run_eagerly,
            )
            history = model.fit(x, y, batch_size=32, epochs=3, verbose=0)
            assert isinstance(
                model.optimizer, keras.optimizers.LossScaleOptimizer
            )
            assert model.layers[0].kernel.dtype == "float32"
            assert keras.ops.convert_to_numpy(model(x[:2])).dtype == np.float16
            assert history.history["loss"][-1] < history.history["loss"][0]
            results.append(
                (history.history["loss"], model.get_weights(),
                 float(model.optimizer.dynamic_scale))
            )
    finally:
        keras.config.set_dtype_policy("float32")
    (loss_c, w_c, scale_c), (loss_e, w_e, scale_e) = results
    np.testing.assert_allclose(loss_c, loss_e, rtol=2e-3)
    for a, b in zip(w_c, w_e):
        np.testing.assert_allclose(a, b, rtol=2e-2, atol=2e-3)
    assert scale_c == scale_e
