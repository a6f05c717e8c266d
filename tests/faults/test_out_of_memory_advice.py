"""Out-of-memory errors list only remedies keras_ipu has, chosen by what
fills the tile, with the effect the simulator computes for each."""

import re

import keras
import numpy as np
import pytest

from keras_ipu.device.simulator.memory_model import IPUOutOfMemoryError


@pytest.fixture
def eight_tiles(monkeypatch):
    monkeypatch.setenv("TF_POPLAR_FLAGS", "--use_ipu_model --ipu_model_tiles=8")


def _mlp(optimizer, width, inputs):
    model = keras.Sequential([
        keras.Input((inputs,)),
        keras.layers.Dense(width, activation="relu"),
        keras.layers.Dense(width, activation="relu"),
        keras.layers.Dense(10),
    ])
    model.compile(optimizer, keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  steps_per_execution=2)
    return model


def _fit(model, samples, inputs, batch_size):
    x = np.ones((samples, inputs), np.float32)
    model.fit(x, np.zeros(samples, np.int32), batch_size=batch_size, verbose=0)


def test_activations_overflow_the_tile_smaller_batches_are_compiled(eight_tiles, monkeypatch):
    from keras_ipu.backend.trainer_ops import memory_advice

    # The halvings stop compiling after _BUDGET_SECONDS (20 s; under 6 s in all
    # here at load 8): a busy machine must not cut the list this test reads.
    monkeypatch.setattr(memory_advice, "_BUDGET_SECONDS", 600.0)
    model = _mlp("sgd", 512, 256)
    with pytest.raises(IPUOutOfMemoryError) as info:
        _fit(model, 2048, 256, 1024)
    text = str(info.value)
    assert "not always live" in text and "Program inputs on this tile: weights" in text
    assert "A smaller batch size: the activations shrink with it" in text
    assert "Float16 activations" in text
    for absent in ("availableMemoryProportion", "pipeline", "always-live memory alone"):
        assert absent not in text, absent
    # The alternatives compiled into a cache of their own, not the model's.
    (loop,) = model.train_function.device_loop._loops.values()
    assert loop.signature_count == 0
    fitting = re.findall(r"With batch_size=(\d+) \(not 1024\), the fullest tile would need [^:]+: fits", text)
    assert fitting, text
    # The simulator's prediction holds: that batch size trains.
    _fit(_mlp("sgd", 512, 256), 2048, 256, int(fitting[0]))


def test_weights_and_optimizer_state_overflow_the_tile_no_batch_advice(eight_tiles):
    model = _mlp("adam", 2048, 16)
    with pytest.raises(IPUOutOfMemoryError) as info:
        _fit(model, 16, 16, 8)
    text = str(info.value)
    assert "The always-live memory alone needs" in text
    assert "a smaller batch shrinks only the data and the activations" in text
    assert re.search(r"An optimizer with less state: its slots take [\d.]+ MiB here", text)
    assert "Fewer or smaller layers: the weights take" in text
    assert "With batch_size" not in text and "A smaller batch size" not in text
    assert "availableMemoryProportion" not in text


def test_a_model_that_does_not_fit_trains_with_debug_allow_out_of_memory(
        eight_tiles, monkeypatch, tmp_path):
    """Poplar's debug.allowOutOfMemory, as a user sets it for a Keras model
    too big for its IPU: without it fit stops at compile and the error names
    it; with it fit compiles, warns that a real IPU could not run the
    program, trains, and the profile report marks the overflowing tiles."""
    import glob
    import json

    from keras_ipu.device.simulator import profile
    from keras_ipu.device.simulator.memory_model import IPUOutOfMemoryWarning
    from keras_ipu.report import summary

    monkeypatch.delenv("POPLAR_ENGINE_OPTIONS", raising=False)
    with pytest.raises(IPUOutOfMemoryError) as info:
        _fit(_mlp("adam", 2048, 16), 16, 16, 8)
    assert "POPLAR_ENGINE_OPTIONS='{\"debug.allowOutOfMemory\": \"true\"}'" in str(info.value)

    monkeypatch.setenv("POPLAR_ENGINE_OPTIONS", json.dumps(
        {"debug.allowOutOfMemory": "true", "autoReport.all": "true",
         "autoReport.directory": str(tmp_path)}))
    keras.utils.set_random_seed(0)
    model = _mlp("adam", 2048, 16)
    before = [np.array(w) for w in model.get_weights()]
    with pytest.warns(IPUOutOfMemoryWarning, match="a real IPU could not run it"):
        _fit(model, 16, 16, 8)
    assert any(np.any(np.array(w) != b) for w, b in zip(model.get_weights(), before))

    (path,) = glob.glob(str(tmp_path / f"train*{profile.SUFFIX}"))
    with open(path) as f:
        report = json.load(f)
    (ipu,), (tiles,) = report["memory"]["ipus"], report["memory"]["tiles"]
    over = [t - tiles["capacity"] for t in tiles["total"] if t > tiles["capacity"]]
    assert not ipu["fits"] and ipu["tiles_over_capacity"] == len(over) == 8
    assert ipu["most_over_bytes"] == max(over)
    # What overflows is the weights and Adam's two moments (not activations).
    assert ipu["categories"]["optimizer state"] >= 2 * ipu["categories"]["weights"]
    report["_path"] = path
    assert "DOES NOT FIT: 8 tiles over capacity" in summary.details(report)
