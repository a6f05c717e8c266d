"""The compiled train step updates weights and optimizer state in place
(donation), and nobody who kept a value sees it change."""

import keras
import numpy as np
import pytest


def _model(optimizer):
    keras.utils.set_random_seed(3)
    model = keras.Sequential([
        keras.Input((20,)),
        keras.layers.Dense(32, activation="relu"),
        keras.layers.Dense(4),
    ])
    model.compile(optimizer, keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def _data():
    rng = np.random.default_rng(0)
    return rng.random((96, 20), dtype=np.float32), rng.integers(0, 4, 96)


@pytest.mark.parametrize(
    "make_optimizer",
    [lambda: keras.optimizers.SGD(0.05, momentum=0.9), lambda: keras.optimizers.Adam(0.01)],
)
def test_in_place_training_matches_the_eager_step(make_optimizer):
    x, y = _data()
    compiled = _model(make_optimizer())
    eager = _model(make_optimizer())
    eager.run_eagerly = True  # op by op on the host: no donation
    a = compiled.fit(x, y, batch_size=16, epochs=3, verbose=0, shuffle=False)
    b = eager.fit(x, y, batch_size=16, epochs=3, verbose=0, shuffle=False)
    np.testing.assert_allclose(a.history["loss"], b.history["loss"], rtol=1e-5)
    for u, v in zip(compiled.get_weights(), eager.get_weights()):
        np.testing.assert_allclose(u, v, rtol=1e-4, atol=1e-6)


@pytest.mark.numpy_engine
def test_weights_are_updated_in_their_own_buffers():
    x, y = _data()
    model = _model(keras.optimizers.SGD(0.05, momentum=0.9))
    model.train_on_batch(x[:16], y[:16])
    kernel = model.layers[0].kernel
    buffer = kernel._value._value  # the array, without reading the variable
    model.train_on_batch(x[16:32], y[16:32])
    assert np.shares_memory(kernel._value._value, buffer)


def test_a_value_read_between_steps_never_changes():
    x, y = _data()
    model = _model(keras.optimizers.SGD(0.05, momentum=0.9))
    model.fit(x, y, batch_size=16, epochs=1, verbose=0)
    kernel = model.layers[0].kernel
    held = kernel.value  # a Tensor the user keeps
    held_array = np.asarray(kernel)
    snapshot = np.array(held)
    model.fit(x, y, batch_size=16, epochs=1, verbose=0)
    np.testing.assert_array_equal(np.asarray(held), snapshot)
    np.testing.assert_array_equal(held_array, snapshot)
    assert not np.array_equal(np.asarray(kernel.value), snapshot)  # it trained


def test_weights_kept_by_a_callback_stay_as_they_were():
    class Keep(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.kept = []

        def on_train_batch_end(self, batch, logs=None):
            layer = self.model.layers[0]
            self.kept.append((layer.kernel.value, np.array(layer.kernel.value)))

    x, y = _data()
    model = _model(keras.optimizers.SGD(0.05, momentum=0.9))
    keep = Keep()
    model.fit(x, y, batch_size=16, epochs=2, verbose=0, callbacks=[keep])
    for tensor, copy in keep.kept:
        np.testing.assert_array_equal(np.asarray(tensor), copy)
    assert not np.array_equal(keep.kept[0][1], keep.kept[-1][1])
