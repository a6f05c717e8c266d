"""Exporting keras_ipu programs as TensorFlow SavedModels.

A program is traced once into a keras_ipu Graph (`stateless_trace`), its
input sizes left open where the signature leaves them open, and emitted as
TensorFlow ops by the emitter the XLA engine uses
(keras_ipu/device/to_tensorflow, one rule per primitive, as jax2tf does)
inside a `tf.function` over `tf.Variable`s (`tf_function`): TensorFlow
loads and runs the SavedModel with no keras_ipu installed.

Users reach it through Keras (`model.export(path)` under KERAS_BACKEND=ipu,
`keras.export.ExportArchive`: keras_ipu/backend/export.py).
This package imports TensorFlow when its modules are used.
"""
