"""Graphcore's Keras export for TensorFlow Serving: the model's
`export_for_ipu_serving` method (models made in an IPUStrategy scope) and
`serving.export_keras(model, ...)`.

The model's inference (its call with training=False) for one batch of the
export's batch size is written as a SavedModel, its variables frozen into
constants, between the optional CPU pre- and post-processing functions, as
serving.export_single_step writes a predict step (serving_export.py):

- under KERAS_BACKEND=ipu the call is traced into the keras_ipu IR
  (export/stateless_trace.py) and emitted as TensorFlow ops by the emitter
  of keras_ipu/device/to_tensorflow (the one model.export uses);
- under KERAS_BACKEND=tensorflow the call is TensorFlow code: it goes
  through the TensorFlow front end as export_single_step's step does.

A pipelined model exports the same values (the stages change where the
layers run, not what they compute); as on the IPU, its
`steps_per_execution` must suit the pipeline (Poplar's check of the
iterations of an inference pipeline). Graphcore's SavedModel holds a
Poplar executable for the embedded runtime; this one holds the TensorFlow
graph, which any TensorFlow serves.
"""

import os

from keras.src import tree

_NOT_EXTENDED = (
    "Provided model was not created inside an IPU strategy, so it does not contain "
    "IPU-specific functions. Please wrap its creation inside an IPU strategy.")


def export_keras(model, export_dir, batch_size=None, output_names=None,
                 preprocessing_step=None, preprocessing_step_signature=None,
                 postprocessing_step=None, postprocessing_step_signature=None,
                 purge_export_dir=False):
    """Graphcore's serving.export_keras: the model's export_for_ipu_serving."""
    if not hasattr(model, "export_for_ipu_serving"):
        raise ValueError(_NOT_EXTENDED)
    return model.export_for_ipu_serving(
        export_dir, batch_size, output_names, preprocessing_step,
        preprocessing_step_signature, postprocessing_step, postprocessing_step_signature,
        purge_export_dir)


def input_signature(model, batch_size=None):
    """(the flat tf.TensorSpecs of the model's inputs with the batch size
    fixed, the structure the model's call takes them in)."""
    import tensorflow as tf

    if not model.built:
        raise ValueError(
            f"Model {model.name} has not been built: build it with the input shapes "
            "(model.build(...)) before exporting it for IPU serving.")
    graph = model._ipu_graph_function()
    structure = getattr(graph, "_inputs_struct", graph.inputs)
    leaves = tree.flatten(structure)
    if batch_size is not None:
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}.")
    else:
        sizes = {leaf.shape[0] for leaf in leaves}
        if None in sizes or len(sizes) != 1:
            raise ValueError(
                f"Model {model.name} was built without a batch size, and an exported "
                "model runs a program compiled for one batch size: pass batch_size to "
                "export_for_ipu_serving, or give the inputs a batch size "
                "(keras.Input(shape, batch_size=...)).")
        batch_size = sizes.pop()
    # Named after the model's inputs: the names TensorFlow Serving's
    # requests give.
    specs = [tf.TensorSpec((batch_size,) + tuple(leaf.shape[1:]), tf.as_dtype(leaf.dtype),
                           name=getattr(leaf, "name", None))
             for leaf in leaves]
    return specs, structure


def _check_iterations(model):
    """A pipelined model's steps_per_execution, checked as the iterations
    of an inference pipeline."""
    from keras_ipu.models.functions import check_pipeline
    from keras_ipu.models.functions import check_pipeline_iterations

    if not model._ipu_is_pipelined():
        return
    mapping = check_pipeline(model, training=False)
    iterations = int(getattr(model, "steps_per_execution", 1) or 1)
    check_pipeline_iterations(iterations, model._ipu_options.pipeline_schedule, mapping,
                              training=False)


def _inference_step(model, specs, structure):
    """A function of the flat input tensors returning the model's
    inference outputs, as TensorFlow ops."""
    import numpy as np
    import tensorflow as tf
    from keras import backend

    def call(*flat):
        return model(tree.pack_sequence_as(structure, list(flat)), training=False)

    if backend.backend() == "tensorflow":
        from keras_ipu.export.serving_export import emitted_step

        return emitted_step(tf.function(call, input_signature=specs, autograph=False), specs)
    from keras_ipu.export.stateless_trace import trace
    from keras_ipu.export.tf_function import frozen_function
    from keras_ipu.export.tf_function import tensor_specs

    variables = list(model.variables)
    traced = trace(call, variables, tensor_specs(specs), name=f"model {model.name}")
    return frozen_function(traced, [np.asarray(v.value) for v in variables])


def export_model(model, export_dir, batch_size=None, output_names=None,
                 preprocessing_step=None, preprocessing_step_signature=None,
                 postprocessing_step=None, postprocessing_step_signature=None,
                 purge_export_dir=False):
    """Write the SavedModel of `model` (see the module doc) and return its
    predict function."""
    from keras_ipu.export.serving_export import _check_signature
    from keras_ipu.export.serving_export import _preprocessed
    from keras_ipu.export.serving_export import _prepare_dir
    from keras_ipu.export.serving_export import write_serving_model

    _check_signature(postprocessing_step_signature, "postprocessing_step_signature")
    export_dir = os.fspath(export_dir)
    _prepare_dir(export_dir, purge_export_dir)
    _check_iterations(model)
    specs, structure = input_signature(model, batch_size)
    pre = None
    outer = specs
    if preprocessing_step is not None:
        outer, pre, produced = _preprocessed(preprocessing_step, preprocessing_step_signature,
                                             None)
        if [(s.shape, s.dtype) for s in produced] != [(s.shape, s.dtype) for s in specs]:
            raise ValueError(
                f"preprocessing_step returns {produced}, but model {model.name} takes "
                f"{specs}: its outputs must match the model's inputs (shapes with the "
                "batch size, and dtypes).")
    step = _inference_step(model, specs, structure)
    return write_serving_model(step, export_dir, outer, pre, postprocessing_step, output_names)
