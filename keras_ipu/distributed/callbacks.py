"""Which Keras callbacks write on which instance of a multi-process job.

The instances of a data-parallel job hold the same weights and see the same
(globally reduced) logs, so one writer is enough and several would fight
over the same files: ModelCheckpoint, TensorBoard, CSVLogger and the saving
half of BackupAndRestore run on instance 0 only. Every instance still
restores a BackupAndRestore backup when training starts, so that all resume
at the same epoch. `on_every_instance(callback)` keeps a callback on every
instance (e.g. a ModelCheckpoint whose path names the instance).
"""

_EVERY_INSTANCE = "_keras_ipu_on_every_instance"


def on_every_instance(callback):
    """Mark `callback` to run on every instance of the job; returns it."""
    setattr(callback, _EVERY_INSTANCE, True)
    return callback


def _writer_types():
    from keras import callbacks

    return (callbacks.ModelCheckpoint, callbacks.TensorBoard, callbacks.CSVLogger)


def for_instance(callbacks, instance_index):
    """The callbacks that run on `instance_index` (a list; None stays None)."""
    if callbacks is None or instance_index == 0:
        return callbacks
    from keras import callbacks as keras_callbacks

    container = None
    if isinstance(callbacks, keras_callbacks.CallbackList):
        container, callbacks = callbacks, list(callbacks.callbacks)
    kept = []
    for callback in callbacks:
        if getattr(callback, _EVERY_INSTANCE, False):
            kept.append(callback)
        elif isinstance(callback, keras_callbacks.BackupAndRestore):
            kept.append(_restore_only(callback))
        elif not isinstance(callback, _writer_types()):
            kept.append(callback)
    if container is not None:
        container.callbacks = kept
        return container
    return kept


def _restore_only(backup):
    from keras import callbacks as keras_callbacks

    class RestoreOnly(keras_callbacks.Callback):
        def set_model(self, model):
            super().set_model(model)
            backup.set_model(model)

        def set_params(self, params):
            super().set_params(params)
            backup.set_params(params)

        def on_train_begin(self, logs=None):
            backup.on_train_begin(logs)

    return RestoreOnly()
