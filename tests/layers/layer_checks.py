"""Helpers the IPU layer tests share."""

import keras
import numpy as np


def saved_and_loaded(model, tmp_path, *inputs):
    """Save `model` to a .keras file, load it back, and check that the
    loaded model gives the same predictions; returns the loaded model."""
    path = tmp_path / "model.keras"
    model.save(path)
    loaded = keras.saving.load_model(path)
    want = model.predict(list(inputs) if len(inputs) > 1 else inputs[0], verbose=0)
    got = loaded.predict(list(inputs) if len(inputs) > 1 else inputs[0], verbose=0)
    for w, g in zip(keras.tree.flatten(want), keras.tree.flatten(got)):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))
    return loaded


def config_round_trip(layer):
    """A layer rebuilt from its serialized config has the same config."""
    rebuilt = keras.layers.deserialize(keras.layers.serialize(layer))
    assert type(rebuilt) is type(layer)
    assert rebuilt.get_config() == layer.get_config()
    return rebuilt
