"""Under the ipu backend, .keras, .weights.h5, legacy .h5 and
ModelCheckpoint saves are atomic: a kill or an error during a save leaves
the previous file whole."""

import os
import signal
import stat
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest
from keras.src.legacy.saving import legacy_h5_format
from keras.src.saving import saving_lib


def _model(seed):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile("sgd", "mse")
    return model


def _load(path):
    if path.endswith(".weights.h5"):
        model = _model(0)
        model.load_weights(path)
        return model
    return keras.saving.load_model(path, compile=False)


def _save(model, path):
    if path.endswith(".weights.h5"):
        model.save_weights(path)
    else:
        model.save(path)


def test_the_keras_writers_are_atomic_under_ipu():
    assert saving_lib.save_model.writes_atomically
    assert saving_lib.save_weights_only.writes_atomically
    assert legacy_h5_format.save_model_to_hdf5.writes_atomically


@pytest.mark.parametrize("name", ["model.keras", "model.weights.h5", "model.h5"])
def test_a_failed_save_leaves_the_previous_file(tmp_path, monkeypatch, name):
    path = str(tmp_path / name)
    first = _model(1)
    _save(first, path)
    expected = first.get_weights()

    def broken(*args, **kwargs):
        raise RuntimeError("disk full")

    if name == "model.h5":
        monkeypatch.setattr(legacy_h5_format, "save_weights_to_hdf5_group", broken)
    else:
        monkeypatch.setattr(saving_lib, "_save_state", broken)
    with pytest.raises(RuntimeError, match="disk full"):
        _save(_model(2), path)
    monkeypatch.undo()
    assert os.listdir(tmp_path) == [name]  # no temporary file left
    for a, b in zip(_load(path).get_weights(), expected):
        np.testing.assert_array_equal(a, b)


def test_a_saved_file_has_the_permissions_of_a_plain_file(tmp_path):
    old = os.umask(0o022)
    try:
        _model(1).save(str(tmp_path / "model.keras"))
    finally:
        os.umask(old)
    mode = stat.S_IMODE(os.stat(tmp_path / "model.keras").st_mode)
    assert mode == 0o644, oct(mode)


_KILLED_SAVER = textwrap.dedent("""
    import os, sys, time
    import numpy as np
    import keras
    from keras.src.saving import saving_lib

    path, how = sys.argv[1], sys.argv[2]
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile("sgd", "mse")
    x, y = np.ones((8, 3), "float32"), np.ones((8, 2), "float32")
    checkpoint = keras.callbacks.ModelCheckpoint(
        path, save_weights_only=path.endswith(".weights.h5"))
    model.fit(x, y, epochs=1, verbose=0, callbacks=[checkpoint])
    np.save(path + ".expected.npy", np.concatenate(
        [w.ravel() for w in model.get_weights()]))

    original = saving_lib._save_state
    def stuck(*args, **kwargs):  # part of the file is written, then a kill
        original(*args, **kwargs)
        print("saving", flush=True)
        time.sleep(600)
    saving_lib._save_state = stuck
    if how == "checkpoint":
        model.fit(x, y, epochs=1, verbose=0, callbacks=[checkpoint])
    else:
        model.save(path)
""")


@pytest.mark.parametrize("name, how", [
    ("model.keras", "save"),
    ("ckpt.weights.h5", "checkpoint"),
])
def test_a_process_killed_mid_save_leaves_the_previous_file(tmp_path, name, how):
    path = str(tmp_path / name)
    env = dict(os.environ, KERAS_BACKEND="ipu")
    child = subprocess.Popen(
        [sys.executable, "-c", _KILLED_SAVER, path, how],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )
    try:
        line = child.stdout.readline().strip()
        assert line == "saving", child.stderr.read()[-3000:]
    finally:
        child.send_signal(signal.SIGKILL)
        child.communicate()
    expected = np.load(path + ".expected.npy")
    saved = np.concatenate([w.ravel() for w in _load(path).get_weights()])
    np.testing.assert_array_equal(saved, expected)
    # The killed writer's temporary file goes with the next save of that name.
    assert any(n.startswith(".tmp-") for n in os.listdir(tmp_path))
    _save(_model(3), path)
    assert sorted(os.listdir(tmp_path)) == sorted([name, name + ".expected.npy"])


def test_a_keras_without_the_writer_names_the_supported_version():
    import ast

    from keras_ipu import _hook

    with pytest.raises(_hook.KerasVersionError, match="save_model"):
        _hook._make_saves_atomic(ast.parse("def other():\n    pass\n"),
                                 "keras.src.saving.saving_lib")


def test_a_failed_backup_leaves_the_previous_training_metadata(tmp_path, monkeypatch):
    """BackupAndRestore writes training_metadata.json with a plain open:
    a kill or an error mid-write left an empty file, and every later fit
    with that backup failed with a JSON error. Under ipu the previous
    metadata stays whole and the job resumes from it."""
    import json
    import types

    from keras.src.callbacks import backup_and_restore

    backup = str(tmp_path / "backup")
    metadata = os.path.join(backup, "training_metadata.json")
    x, y = np.ones((8, 3), "float32"), np.ones((8, 2), "float32")
    model = _model(1)
    model.fit(x, y, epochs=1, verbose=0,
              callbacks=[keras.callbacks.BackupAndRestore(backup, delete_checkpoint=False)])
    assert json.loads(open(metadata).read())["epoch"] == 1

    def broken(*args, **kwargs):
        raise RuntimeError("killed mid-write")

    monkeypatch.setattr(backup_and_restore, "json",
                        types.SimpleNamespace(dumps=broken, loads=json.loads))
    with pytest.raises(RuntimeError, match="killed mid-write"):
        model.fit(x, y, epochs=2, verbose=0,
                  callbacks=[keras.callbacks.BackupAndRestore(backup, delete_checkpoint=False)])
    monkeypatch.undo()
    assert json.loads(open(metadata).read())["epoch"] == 1
    assert not [n for n in os.listdir(backup) if n.startswith(".tmp-")]
    history = model.fit(x, y, epochs=2, verbose=0,
                        callbacks=[keras.callbacks.BackupAndRestore(backup, delete_checkpoint=False)])
    assert len(history.history["loss"]) == 1  # resumed at epoch 1 of 2


def test_a_keras_without_the_metadata_write_names_the_supported_version():
    import ast

    from keras_ipu import _hook

    with pytest.raises(_hook.KerasVersionError, match="BackupAndRestore._save_model"):
        _hook._make_opens_atomic(ast.parse("class BackupAndRestore:\n    pass\n"),
                                 "keras.src.callbacks.backup_and_restore")
