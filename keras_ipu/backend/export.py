"""`model.export(format="tf_saved_model")` / keras.export.ExportArchive.

A SavedModel is a TensorFlow graph. The TensorFlow backend has one already,
JAX converts with jax2tf; keras_ipu's traced programs have no TensorFlow
lowering, so exporting a SavedModel is not supported on the ipu backend.
Every entry point raises NotImplementedError saying what to do instead.
"""

SAVED_MODEL_NOT_SUPPORTED = (
    # Keras' own wording for backends without SavedModel export first.
    "`export_saved_model` only currently supports the tensorflow, jax and "
    "torch backends. Exporting a TensorFlow SavedModel is not supported on "
    "the ipu backend: "
    "a SavedModel is a TensorFlow graph and keras_ipu has no TensorFlow "
    "lowering of its programs (`ExportArchive.{method}` was called). Save "
    "the model with model.save('model.keras'), load it in a process with "
    "KERAS_BACKEND=tensorflow and export it there."
)


class IPUExportArchive:
    def _unsupported(self, method):
        raise NotImplementedError(SAVED_MODEL_NOT_SUPPORTED.format(method=method))

    def track(self, resource):
        self._unsupported("track")

    def add_endpoint(self, name, fn, input_signature=None, **kwargs):
        self._unsupported("add_endpoint")

    def track_and_add_endpoint(self, name, resource, input_signature, **kwargs):
        self._unsupported("track_and_add_endpoint")

    def add_variable_collection(self, name, variables):
        self._unsupported("add_variable_collection")

    def write_out(self, filepath, options=None, verbose=True):
        self._unsupported("write_out")
