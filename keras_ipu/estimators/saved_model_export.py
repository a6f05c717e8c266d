"""An estimator's SavedModel export (export_saved_model, export_savedmodel,
experimental_export_all_saved_models), as tf.estimator wrote it.

As TensorFlow 1 did, the export builds a new graph: the
serving_input_receiver_fn's receiver tensors (placeholders, the
SavedModel's inputs) and whatever host ops make the features from them
(parsing tf.Example protos), then the model. The model part is the
model_fn traced in PREDICT mode on the features, with the checkpoint's
values restored into its variables, compiled through the TensorFlow front
end as predict() runs it, and emitted back as TensorFlow ops by the
emitter `serving.export_single_step` and `model.export` use
(export/serving_export.emitted_step; variables frozen into constants, as
Graphcore's serving exports freeze them). So the SavedModel serves on any
TensorFlow with the numbers the simulated IPU computes, and needs no
keras_ipu.

The SavedModel is a TensorFlow 1 one (tf.compat.v1.saved_model.Builder,
tag 'serve'), one SignatureDef per export output of the model_fn
(TensorFlow's own export_utils build them: 'serving_default' from
export_outputs, or a PredictOutput of the predictions), written into
export_dir_base/temp-<timestamp> and renamed to
export_dir_base/<timestamp> when complete; a failed export removes its
temporary directory.

Features need static shapes (the IPU program is compiled for one batch
size): a batch dimension the receiver leaves open is the model_fn's
params['batch_size'] (the estimator's predict_batch_size per replica),
checked at serving time.
"""

import os
import shutil


def _tf():
    import tensorflow as tf

    return tf


_NO_SERVING_INPUT = "An input_receiver_fn must be defined."
_TRAIN_EVAL_GRAPHS = (
    "keras_ipu's estimators export the PREDICT graph only: a TRAIN or EVAL "
    "graph in a SavedModel is a TensorFlow 1 session graph (a train_op and "
    "metric update ops run by tf.compat.v1.Session), which the IPU program "
    "emitted here, a function of the features, does not make.")


def check_receiver_fn_map(input_receiver_fn_map):
    """The PREDICT receiver fn of `input_receiver_fn_map` ({mode: fn})."""
    from keras_ipu.estimators.spec import ModeKeys

    if not isinstance(input_receiver_fn_map, dict) or not input_receiver_fn_map:
        raise ValueError(_NO_SERVING_INPUT)
    for mode, fn in input_receiver_fn_map.items():
        if mode not in (ModeKeys.TRAIN, ModeKeys.EVAL, ModeKeys.PREDICT):
            raise ValueError(f"Unknown mode {mode!r}: use tf.estimator.ModeKeys.")
        if not fn:
            raise ValueError(_NO_SERVING_INPUT)
        if mode != ModeKeys.PREDICT:
            raise NotImplementedError(f"Exporting mode {mode!r}: {_TRAIN_EVAL_GRAPHS}")
    return input_receiver_fn_map[ModeKeys.PREDICT]


def _receiver(serving_input_receiver_fn):
    from keras_ipu.estimators.export import ServingInputReceiver
    from keras_ipu.estimators.export import TensorServingInputReceiver

    receiver = serving_input_receiver_fn()
    if not isinstance(receiver, (ServingInputReceiver, TensorServingInputReceiver)):
        raise TypeError(
            "serving_input_receiver_fn must return a tf.estimator.export."
            "ServingInputReceiver or TensorServingInputReceiver, got "
            f"{type(receiver).__name__}.")
    return receiver


def _feature_specs(features, batch_size):
    """The static tf.TensorSpec of each leaf of `features` (a graph tensor
    or dict of them): an open first dimension becomes `batch_size`."""
    tf = _tf()
    named = features if isinstance(features, dict) else {"feature": features}
    specs = []
    # tf.nest's order (sorted keys): the order the features are fed in.
    for name, tensor in sorted(named.items()):
        if isinstance(tensor, tf.SparseTensor):
            raise NotImplementedError(
                f"The serving feature {name!r} is a SparseTensor: the IPU program "
                "takes dense tensors of static shapes (use tf.io.FixedLenFeature, "
                "or densify it in the serving_input_receiver_fn).")
        shape = tensor.shape.as_list()
        if shape and shape[0] is None and batch_size is not None:
            shape[0] = batch_size
        if None in shape:
            raise ValueError(
                f"The serving feature {name!r} has shape {tensor.shape}, but the IPU "
                "program is compiled for static shapes: give the serving input receiver a "
                "fixed batch size (default_batch_size=...) or the estimator a "
                "predict_batch_size, and fix the other dimensions.")
        specs.append(tf.TensorSpec(shape, tensor.dtype))
    return specs


def _copy_assets_extra(assets_extra, export_dir):
    """tf.estimator's assets_extra: {path under assets.extra: source file}."""
    for dest, source in (assets_extra or {}).items():
        target = os.path.join(export_dir, "assets.extra", dest)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copyfile(source, target)


def export(export_dir_base, serving_input_receiver_fn, emitted_model, batch_size,
           assets_extra=None, as_text=False, strip_default_attrs=True):
    """Write the SavedModel (see the module doc) and return its directory
    (bytes, as tf.estimator returned it). `emitted_model(structure, specs)`
    gives the model part: a function of the flat features returning
    {signature key: (ExportOutput class, {field: tensor})}."""
    tf = _tf()
    from tensorflow.python.saved_model.model_utils import export_utils

    if not serving_input_receiver_fn:
        raise ValueError(_NO_SERVING_INPUT)
    export_dir = export_utils.get_timestamped_export_dir(os.fspath(export_dir_base))
    temp_dir = export_utils.get_temp_export_dir(export_dir)
    graph = tf.Graph()
    with graph.as_default():
        receiver = _receiver(serving_input_receiver_fn)
    specs = _feature_specs(receiver.features, batch_size)
    model = emitted_model(receiver.features, specs)
    try:
        with graph.as_default():
            flat = [tf.ensure_shape(t, s.shape)
                    for t, s in zip(tf.nest.flatten(receiver.features), specs)]
            export_outputs = {key: cls(**fields) for key, (cls, fields) in model(*flat).items()}
            signatures = export_utils.build_all_signature_defs(
                receiver.receiver_tensors, export_outputs,
                receiver.receiver_tensors_alternatives, serving_only=True)
            builder = tf.compat.v1.saved_model.Builder(temp_dir)
            with tf.compat.v1.Session(graph=graph) as session:
                builder.add_meta_graph_and_variables(
                    session, [tf.saved_model.SERVING], signature_def_map=signatures,
                    strip_default_attrs=strip_default_attrs)
            builder.save(as_text)
        _copy_assets_extra(assets_extra, os.fsdecode(temp_dir))
        os.rename(temp_dir, export_dir)
    finally:
        shutil.rmtree(temp_dir, ignore_errors=True)
    return export_dir


def traced_export_outputs(spec_export_outputs, predictions):
    """Inside the traced model: {signature key: (ExportOutput class, {field:
    tensor})} of the model_fn's export_outputs (TensorFlow's rules: one
    of them 'serving_default', or a PredictOutput of the predictions)."""
    from tensorflow.python.saved_model.model_utils import export_output
    from tensorflow.python.saved_model.model_utils import export_utils

    found = export_utils.get_export_outputs(spec_export_outputs, predictions)
    fields_of = {export_output.PredictOutput: ("outputs",),
                 export_output.ClassificationOutput: ("scores", "classes"),
                 export_output.RegressionOutput: ("value",)}
    traced = {}
    for key, output in found.items():
        names = fields_of.get(type(output))
        if names is None:
            raise NotImplementedError(
                f"export_outputs[{key!r}] is a {type(output).__name__}: keras_ipu exports "
                "PredictOutput, ClassificationOutput and RegressionOutput.")
        traced[key] = (type(output), {n: getattr(output, n) for n in names
                                      if getattr(output, n) is not None})
    for key, (_, fields) in traced.items():
        for name, tensor in fields.items():
            tensors = tensor.values() if isinstance(tensor, dict) else [tensor]
            if any(t.dtype == _tf().string for t in tensors):
                raise NotImplementedError(
                    f"export_outputs[{key!r}] {name} is a string tensor, which the IPU "
                    "cannot compute (XLA has no strings): return class indices, or map "
                    "them to names after serving.")
    return traced
