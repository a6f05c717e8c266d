"""predict/evaluate on the ipu backend: inputs, steps_per_execution,
callbacks, the *_on_batch methods, and what is not available yet."""

import numpy as np
import pytest

import keras

N, BATCH = 10, 2  # five batches


def make_model(steps_per_execution=1):
    model = keras.Sequential(
        [
            keras.Input((3,)),
            keras.layers.Dense(4, activation="relu"),
            keras.layers.Dense(2),
        ]
    )
    rng = np.random.default_rng(0)
    for v in model.weights:
        v.assign(rng.normal(size=v.shape).astype("float32"))
    model.compile(
        loss="mse", metrics=["mae"], steps_per_execution=steps_per_execution
    )
    return model


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(N, 3)).astype("float32")
    y = rng.normal(size=(N, 2)).astype("float32")
    return x, y


def numpy_forward(model, x):
    w1, b1, w2, b2 = (keras.ops.convert_to_numpy(v) for v in model.weights)
    return np.maximum(x @ w1 + b1, 0) @ w2 + b2


def test_predict_computes_the_model(data):
    x, _ = data
    model = make_model()
    got = model.predict(x, batch_size=BATCH, verbose=0)
    assert isinstance(got, np.ndarray) and got.shape == (N, 2)
    np.testing.assert_allclose(got, numpy_forward(model, x), rtol=1e-5, atol=1e-6)


def test_evaluate_computes_loss_and_metric(data):
    x, y = data
    model = make_model()
    logs = model.evaluate(x, y, batch_size=3, verbose=0, return_dict=True)
    err = numpy_forward(model, x) - y
    np.testing.assert_allclose(logs["loss"], np.mean(err**2), rtol=1e-5)
    np.testing.assert_allclose(logs["mae"], np.mean(np.abs(err)), rtol=1e-5)
    assert model.evaluate(x, y, batch_size=3, verbose=0) == pytest.approx(
        [logs["loss"], logs["mae"]]
    )


@pytest.mark.parametrize("steps_per_execution", [2, 3, 5, 7])
def test_steps_per_execution_gives_the_same_results(data, steps_per_execution):
    x, y = data
    one = make_model()
    many = make_model(steps_per_execution)
    np.testing.assert_array_equal(
        many.predict(x, batch_size=BATCH, verbose=0),
        one.predict(x, batch_size=BATCH, verbose=0),
    )
    np.testing.assert_allclose(
        many.evaluate(x, y, batch_size=BATCH, verbose=0),
        one.evaluate(x, y, batch_size=BATCH, verbose=0),
        rtol=1e-6,
    )


class StepRecorder(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.events = []

    def on_predict_begin(self, logs=None):
        self.events.append("predict_begin")

    def on_predict_batch_end(self, batch, logs=None):
        self.events.append(("predict", batch, logs["outputs"].shape[0]))

    def on_predict_end(self, logs=None):
        self.events.append("predict_end")

    def on_test_batch_end(self, batch, logs=None):
        self.events.append(("test", batch, sorted(logs)))

    def on_test_end(self, logs=None):
        self.events.append(("test_end", sorted(logs)))


def test_callbacks_see_one_call_per_execution(data):
    x, y = data
    model = make_model(steps_per_execution=2)
    recorder = StepRecorder()
    model.predict(x, batch_size=BATCH, verbose=0, callbacks=[recorder])
    # Five batches in executions of 2, 2 and 1; `batch` is Keras' index,
    # begin + steps_per_execution - 1, for the shortened last execution too
    # (as Keras' other backends report it; trainer_test checks it).
    assert recorder.events == [
        "predict_begin",
        ("predict", 1, 4),
        ("predict", 3, 4),
        ("predict", 5, 2),
        "predict_end",
    ]
    recorder.events.clear()
    model.evaluate(x, y, batch_size=BATCH, verbose=0, callbacks=[recorder])
    assert [e[:2] for e in recorder.events[:-1]] == [
        ("test", 1),
        ("test", 3),
        ("test", 5),
    ]
    assert recorder.events[-1] == ("test_end", ["loss", "mae"])


def test_progress_bar_is_printed(data, capsys):
    x, y = data
    model = make_model()
    model.predict(x, batch_size=BATCH, verbose=1)
    model.evaluate(x, y, batch_size=BATCH, verbose=1)
    out = capsys.readouterr().out
    assert out.count("5/5") >= 2
    assert "loss:" in out


class ArrayPyDataset(keras.utils.PyDataset):
    def __init__(self, x, y=None):
        super().__init__()
        self.x, self.y = x, y

    def __len__(self):
        return len(self.x) // BATCH

    def __getitem__(self, i):
        sl = slice(i * BATCH, (i + 1) * BATCH)
        if self.y is None:
            return self.x[sl]
        return self.x[sl], self.y[sl]


def batches(x, y=None):
    for i in range(0, len(x), BATCH):
        if y is None:
            yield (x[i : i + BATCH],)
        else:
            yield x[i : i + BATCH], y[i : i + BATCH]


def tf_dataset(x, y=None):
    import tensorflow as tf

    data = x if y is None else (x, y)
    return tf.data.Dataset.from_tensor_slices(data).batch(BATCH)


INPUT_KINDS = {
    "tf.data": tf_dataset,
    "PyDataset": ArrayPyDataset,
    "generator": batches,
}


@pytest.mark.parametrize("kind", sorted(INPUT_KINDS))
@pytest.mark.parametrize("steps_per_execution", [1, 2])
def test_input_kinds_give_the_same_results(data, kind, steps_per_execution):
    x, y = data
    make_input = INPUT_KINDS[kind]
    model = make_model(steps_per_execution)
    expected_pred = model.predict(x, batch_size=BATCH, verbose=0)
    expected_eval = model.evaluate(x, y, batch_size=BATCH, verbose=0)

    got_pred = model.predict(make_input(x), verbose=0)
    got_eval = model.evaluate(make_input(x, y), verbose=0)

    np.testing.assert_allclose(got_pred, expected_pred, rtol=1e-6)
    np.testing.assert_allclose(got_eval, expected_eval, rtol=1e-6)


def test_ending_input_gives_no_warning(data, recwarn):
    x, y = data
    model = make_model(steps_per_execution=2)
    model.predict(x, batch_size=BATCH, verbose=0)
    model.predict(batches(x), verbose=0)
    model.evaluate(batches(x, y), verbose=0)
    assert not [w for w in recwarn if "ran out of data" in str(w.message)]


def test_asking_for_more_steps_than_the_input_has_warns(data):
    x, _ = data
    model = make_model()
    with pytest.warns(UserWarning, match="ran out of data"):
        got = model.predict(batches(x), steps=N, verbose=0)
    assert got.shape == (N, 2)


def test_generator_with_steps_stops_early(data):
    x, _ = data
    model = make_model()
    got = model.predict(batches(x), steps=3, verbose=0)
    np.testing.assert_allclose(
        got, model.predict(x[: 3 * BATCH], batch_size=BATCH, verbose=0), rtol=1e-6
    )


def test_on_batch_methods(data):
    x, y = data
    model = make_model()
    np.testing.assert_allclose(
        model.predict_on_batch(x), numpy_forward(model, x), rtol=1e-5, atol=1e-6
    )
    logs = model.test_on_batch(x, y, return_dict=True)
    expected = model.evaluate(x, y, batch_size=N, verbose=0, return_dict=True)
    assert logs == pytest.approx(expected)
    # Metrics restart at every call: the same batch gives the same result.
    assert model.test_on_batch(x[:2], y[:2]) == model.test_on_batch(x[:2], y[:2])


def test_unbuilt_subclassed_model_builds_on_first_batch(data):
    x, y = data

    class TwoLayers(keras.Model):
        def __init__(self):
            super().__init__()
            self.hidden = keras.layers.Dense(4, activation="relu")
            self.out = keras.layers.Dense(2)

        def call(self, inputs):
            return self.out(self.hidden(inputs))

    model = TwoLayers()
    model.compile(loss="mse")
    loss = model.evaluate(batches(x, y), verbose=0)
    assert model.built and np.isfinite(loss)
    assert model.predict(x, verbose=0).shape == (N, 2)


def test_evaluate_needs_compile(data):
    x, y = data
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    with pytest.raises(ValueError, match="compile"):
        model.evaluate(x, y, verbose=0)


@pytest.mark.parametrize("method", ["fit", "train_on_batch"])
def test_training_methods_update_the_weights(data, method):
    # Training itself is tested in test_training.py; here only that the
    # methods run next to the inference loops and change the weights.
    x, y = data
    model = make_model()
    before = [keras.ops.convert_to_numpy(v) for v in model.weights]
    if method == "fit":
        model.fit(x, y, batch_size=BATCH, verbose=0)
    else:
        model.train_on_batch(x, y)
    after = [keras.ops.convert_to_numpy(v) for v in model.weights]
    assert all(not np.array_equal(a, b) for a, b in zip(before, after))
