"""Only instance 0 writes checkpoints and logs (keras_ipu.distributed.callbacks)."""

import keras
import numpy as np

from keras_ipu.distributed import callbacks as instance_callbacks


def _all(tmp_path):
    return [
        keras.callbacks.ModelCheckpoint(str(tmp_path / "ckpt.weights.h5"), save_weights_only=True),
        keras.callbacks.TensorBoard(str(tmp_path / "logs")),
        keras.callbacks.CSVLogger(str(tmp_path / "log.csv")),
        keras.callbacks.BackupAndRestore(str(tmp_path / "backup")),
        keras.callbacks.EarlyStopping(monitor="loss"),
    ]


def test_instance_0_keeps_every_callback(tmp_path):
    callbacks = _all(tmp_path)
    assert instance_callbacks.for_instance(callbacks, 0) is callbacks
    assert instance_callbacks.for_instance(None, 3) is None


def test_other_instances_keep_readers_and_restore_only(tmp_path):
    callbacks = _all(tmp_path)
    mine = instance_callbacks.on_every_instance(
        keras.callbacks.ModelCheckpoint(str(tmp_path / "mine.weights.h5"), save_weights_only=True)
    )
    kept = instance_callbacks.for_instance(callbacks + [mine], 1)
    kinds = [type(c).__name__ for c in kept]
    assert kinds == ["RestoreOnly", "EarlyStopping", "ModelCheckpoint"]
    assert kept[2] is mine


def test_restore_only_backup_restores_and_never_writes(tmp_path):
    def model():
        m = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        m.compile(optimizer="sgd", loss="mse")
        return m

    x, y = np.ones((4, 2), np.float32), np.ones((4, 1), np.float32)
    writer = model()
    backup_dir = tmp_path / "backup"
    # Instance 0 trains one epoch and leaves a backup (the job "died" after it).
    writer.fit(x, y, epochs=1, verbose=0,
               callbacks=[keras.callbacks.BackupAndRestore(str(backup_dir), delete_checkpoint=False)])
    files = sorted(p.name for p in backup_dir.iterdir())
    # Instance 1 restores the same backup and resumes at epoch 1, writing nothing.
    reader = model()
    restore = instance_callbacks.for_instance(
        [keras.callbacks.BackupAndRestore(str(backup_dir))], 1)
    history = reader.fit(x, y, epochs=2, verbose=0, callbacks=restore)
    assert history.epoch == [1]
    assert sorted(p.name for p in backup_dir.iterdir()) == files
