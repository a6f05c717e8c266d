"""`model.export(path)` / keras.export.ExportArchive on the ipu backend.

A SavedModel is a TensorFlow graph. As the JAX backend converts its traced
programs with jax2tf, the ipu backend traces the endpoint into a keras_ipu
Graph (keras_ipu/export/stateless_trace.py: the variables are inputs, the
ones the endpoint assigns are outputs) and emits it as TensorFlow ops with
the XLA engine's emitter (keras_ipu/device/to_tensorflow), inside a
`tf.function` over `tf.Variable` copies of the Keras variables. TensorFlow
loads and serves the result with no keras_ipu installed; sizes the input
signature leaves open (the batch) stay open.
"""

import inspect

from keras.src import backend
from keras.src import tree
from keras.src.export.saved_model_export_archive import SavedModelExportArchive
from keras.src.utils.module_utils import tensorflow as tf


class IPUExportArchive(SavedModelExportArchive):
    """The ipu backend's SavedModel ExportArchive (see the module doc)."""

    def __init__(self):
        # Keras' base class admits only the backends it ships; the rest of
        # its set-up is the same for every backend.
        self._endpoint_names = []
        self._endpoint_signatures = {}
        self.tensorflow_version = tf.__version__
        self._tf_trackable = tf.__internal__.tracking.AutoTrackable()
        self._tf_trackable.variables = []
        self._tf_trackable.trainable_variables = []
        self._tf_trackable.non_trainable_variables = []
        self._backend_init()

    def _backend_init(self):
        self._backend_variables = []
        self._backend_trainable_variables = []
        self._backend_non_trainable_variables = []
        # id(Keras variable) -> its tf.Variable, so a variable tracked twice
        # (two layers sharing it) has one copy.
        self._tf_variable_of = {}

    def _convert_to_tf_variable(self, backend_variable):
        import numpy as np

        if not isinstance(backend_variable, backend.Variable):
            raise TypeError(
                "`backend_variable` must be a `backend.Variable`. "
                f"Received: backend_variable={backend_variable} of type "
                f"({type(backend_variable)})"
            )
        found = self._tf_variable_of.get(id(backend_variable))
        if found is None:
            found = tf.Variable(
                np.asarray(backend_variable.value),
                trainable=backend_variable.trainable,
                name=backend_variable.name,
            )
            self._tf_variable_of[id(backend_variable)] = found
        return found

    def _backend_track_layer(self, layer):
        trainable = [v for v in layer.trainable_variables
                     if id(v) not in self._tf_variable_of]
        non_trainable = [v for v in layer.non_trainable_variables
                         if id(v) not in self._tf_variable_of]
        self._tf_trackable.trainable_variables += [
            self._convert_to_tf_variable(v) for v in trainable]
        self._tf_trackable.non_trainable_variables += [
            self._convert_to_tf_variable(v) for v in non_trainable]
        self._tf_trackable.variables = (
            self._tf_trackable.trainable_variables
            + self._tf_trackable.non_trainable_variables
        )
        self._backend_trainable_variables += trainable
        self._backend_non_trainable_variables += non_trainable
        self._backend_variables = (
            self._backend_trainable_variables + self._backend_non_trainable_variables
        )

    def _backend_add_endpoint(self, name, fn, input_signature, **kwargs):
        if kwargs:
            raise ValueError(
                f"add_endpoint on the ipu backend takes no extra arguments; got "
                f"{sorted(kwargs)}."
            )
        from keras_ipu.export.stateless_trace import trace
        from keras_ipu.export.tf_function import emitted_function
        from keras_ipu.export.tf_function import tensor_specs

        variables = list(self._backend_variables)
        traced = trace(fn, variables, tensor_specs(list(input_signature)),
                       name=f"endpoint '{name}'")
        tf_variables = [self._convert_to_tf_variable(v) for v in variables]
        call = emitted_function(traced, tf_variables)

        # The endpoint takes the arguments fn names, as Keras' exporters make it.
        parameters = list(inspect.signature(fn).parameters.values())
        call.__signature__ = inspect.Signature(parameters=parameters[:len(input_signature)])
        return tf.function(call, input_signature=input_signature, autograph=False)

    def add_variable_collection(self, name, variables):
        if not isinstance(variables, (list, tuple, set)):
            raise ValueError(
                "Expected `variables` to be a list/tuple/set. "
                f"Received instead object of type '{type(variables)}'."
            )
        if not all(isinstance(v, (tf.Variable, backend.Variable)) for v in variables):
            raise ValueError(
                "Expected all elements in `variables` to be "
                "`tf.Variable` instances. Found instead the following types: "
                f"{list(set(type(v) for v in variables))}"
            )
        converted = [v if isinstance(v, tf.Variable) else self._convert_to_tf_variable(v)
                     for v in variables]
        setattr(self._tf_trackable, name, tree.flatten(converted))
