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

TRAIN and EVAL graphs (experimental_export_all_saved_models, as TensorFlow
1 wrote them: one MetaGraph per mode in one SavedModel, tagged 'train' /
'eval' / 'serve', made in that order, the first saving the variables):
the input receiver gives features and labels (SupervisedInputReceiver);
the model_fn in that mode is compiled through the front end and emitted
by the same emitter, but its variables are not frozen: a training step
that wrote into constants would change nothing, so, as TensorFlow 1 did,
the graph holds TF1 variables named as in the checkpoint, restored from
it and saved in the SavedModel's variables/ directory (the metric
accumulators are local variables, initialised by the graph's init op).
The program reads them and its updates are assigned back: the TRAIN
graph's train op (in the collection TensorFlow 1 kept it in,
'saved_model_train_op') writes the step's new weights and optimizer
state and adds one to the global step, as one step of train() does; its
'train' signature gives the loss (of the variables before the step),
and predictions and metrics where the model_fn returns them. Unlike
TensorFlow 1's, the signature's loss depends on the train op, so each
run of the signature is one step also for TensorFlow 2's loader (which
does not read the train op's collection); a TF1 session fetching both
still runs one step. The EVAL
graph's 'eval' signature gives the loss, predictions and, per metric,
'metrics/<name>/update_op' and '.../value': both are the metric after
this batch's update (the program does both at once), so fetching either
accumulates the batch, as one step of evaluate() does.
"""

import os
import shutil


def _tf():
    import tensorflow as tf

    return tf


_NO_SERVING_INPUT = "An input_receiver_fn must be defined."
_NO_VALID_MODES = "No valid modes for exporting found. Got {}."


def check_receiver_fn_map(input_receiver_fn_map):
    """`input_receiver_fn_map` ({mode: fn}) checked as TensorFlow 1 did."""
    from keras_ipu.estimators.spec import ModeKeys

    if not isinstance(input_receiver_fn_map, dict) or not input_receiver_fn_map:
        raise ValueError(_NO_SERVING_INPUT)
    for mode, fn in input_receiver_fn_map.items():
        if mode not in (ModeKeys.TRAIN, ModeKeys.EVAL, ModeKeys.PREDICT):
            raise ValueError(f"Unknown mode {mode!r}: use tf.estimator.ModeKeys.")
        if not fn:
            raise ValueError(_NO_SERVING_INPUT)
    return input_receiver_fn_map


def _receiver(receiver_fn, supervised):
    from keras_ipu.estimators.export import ServingInputReceiver
    from keras_ipu.estimators.export import SupervisedInputReceiver
    from keras_ipu.estimators.export import TensorServingInputReceiver

    receiver = receiver_fn()
    if supervised:
        if not isinstance(receiver, SupervisedInputReceiver):
            raise TypeError(
                "The input_receiver_fn of a TRAIN or EVAL export must return a "
                "tf.estimator.export.SupervisedInputReceiver (features and labels; "
                "build_raw_supervised_input_receiver_fn makes one), got "
                f"{type(receiver).__name__}.")
    elif not isinstance(receiver, (ServingInputReceiver, TensorServingInputReceiver)):
        raise TypeError(
            "serving_input_receiver_fn must return a tf.estimator.export."
            "ServingInputReceiver or TensorServingInputReceiver, got "
            f"{type(receiver).__name__}.")
    return receiver


def _feature_specs(features, batch_size, what="feature"):
    """The static tf.TensorSpec of each leaf of `features` (a graph tensor
    or dict of them): an open first dimension becomes `batch_size`."""
    tf = _tf()
    named = features if isinstance(features, dict) else {what: features}
    specs = []
    # tf.nest's order (sorted keys): the order the features are fed in.
    for name, tensor in sorted(named.items()):
        if isinstance(tensor, tf.SparseTensor):
            raise NotImplementedError(
                f"The serving {what} {name!r} is a SparseTensor: the IPU program "
                "takes dense tensors of static shapes (use tf.io.FixedLenFeature, "
                "or densify it in the serving_input_receiver_fn).")
        shape = tensor.shape.as_list()
        if shape and shape[0] is None and batch_size is not None:
            shape[0] = batch_size
        if None in shape:
            raise ValueError(
                f"The serving {what} {name!r} has shape {tensor.shape}, but the IPU "
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


def export(export_dir_base, receiver_fns, estimator, prefix, assets_extra=None,
           as_text=False, strip_default_attrs=True):
    """Write the SavedModel of the modes of `receiver_fns` ({mode: input
    receiver fn}; see the module doc) of `estimator` with checkpoint
    `prefix`; return its directory (bytes, as tf.estimator returned it)."""
    from tensorflow.python.saved_model.model_utils import export_utils

    from keras_ipu.estimators.spec import ModeKeys

    receiver_fns = check_receiver_fn_map(receiver_fns)
    modes = [m for m in (ModeKeys.TRAIN, ModeKeys.EVAL, ModeKeys.PREDICT) if m in receiver_fns]
    if not modes:
        raise ValueError(_NO_VALID_MODES.format(list(receiver_fns)))
    export_dir = export_utils.get_timestamped_export_dir(os.fspath(export_dir_base))
    temp_dir = export_utils.get_temp_export_dir(export_dir)
    try:
        builder = _tf().compat.v1.saved_model.Builder(temp_dir)
        for k, mode in enumerate(modes):
            add = _add_predict_graph if mode == ModeKeys.PREDICT else _add_supervised_graph
            add(builder, mode, receiver_fns[mode], estimator, prefix,
                save_variables=k == 0, strip_default_attrs=strip_default_attrs)
        builder.save(as_text)
        _copy_assets_extra(assets_extra, os.fsdecode(temp_dir))
        os.rename(temp_dir, export_dir)
    finally:
        shutil.rmtree(temp_dir, ignore_errors=True)
    return export_dir


def _add_meta_graph(builder, session, save_variables, **kwargs):
    if save_variables:
        builder.add_meta_graph_and_variables(session, **kwargs)
    else:
        builder.add_meta_graph(**kwargs)


def _add_predict_graph(builder, mode, receiver_fn, estimator, prefix, save_variables,
                       strip_default_attrs):
    """The PREDICT MetaGraph ('serve'): its variables frozen (module doc)."""
    tf = _tf()
    from tensorflow.python.saved_model.model_utils import export_utils

    graph = tf.Graph()
    with graph.as_default():
        receiver = _receiver(receiver_fn, supervised=False)
    specs = _feature_specs(receiver.features, estimator.export_batch_size(mode))
    model = estimator.emitted_predict_model(receiver.features, specs, prefix)
    with graph.as_default():
        flat = [tf.ensure_shape(t, s.shape)
                for t, s in zip(tf.nest.flatten(receiver.features), specs)]
        export_outputs = {key: cls(**fields) for key, (cls, fields) in model(*flat).items()}
        signatures = export_utils.build_all_signature_defs(
            receiver.receiver_tensors, export_outputs,
            receiver.receiver_tensors_alternatives, serving_only=True)
        with tf.compat.v1.Session(graph=graph) as session:
            _add_meta_graph(builder, session, save_variables,
                            tags=export_utils.EXPORT_TAG_MAP[mode],
                            signature_def_map=signatures,
                            strip_default_attrs=strip_default_attrs)


def _add_supervised_graph(builder, mode, receiver_fn, estimator, prefix, save_variables,
                          strip_default_attrs):
    """The TRAIN ('train') or EVAL ('eval') MetaGraph: TF1 variables read
    and written by the emitted program (module doc)."""
    tf = _tf()
    from tensorflow.python.saved_model.model_utils import export_output
    from tensorflow.python.saved_model.model_utils import export_utils

    from keras_ipu.estimators.spec import ModeKeys

    graph = tf.Graph()
    with graph.as_default():
        receiver = _receiver(receiver_fn, supervised=True)
    batch = estimator.export_batch_size(mode)
    specs = (_feature_specs(receiver.features, batch),
             _feature_specs(receiver.labels, batch, what="label"))
    step = estimator.emitted_supervised_step(mode, receiver.features, receiver.labels, specs)
    with graph.as_default():
        variables = GraphVariables(estimator.variable_entry)
        global_step = variables.global_step()
        flat = [tf.ensure_shape(t, s.shape) for t, s in zip(
            tf.nest.flatten(receiver.features) + tf.nest.flatten(receiver.labels),
            specs[0] + specs[1])]
        outputs, assigns = step(variables.stand_in, *flat)
        predictions = outputs.get("predictions")
        if mode == ModeKeys.TRAIN:
            # The step's writes, then the global step, as train() counts it.
            with tf.control_dependencies(assigns + tf.nest.flatten(outputs)):
                train_op = tf.group(*assigns, global_step.assign_add(1))
            # The signature's loss (of the variables before the step) runs
            # the step too, so a signature call trains where the train op's
            # collection is not read (TensorFlow 2's loader).
            with tf.control_dependencies([train_op]):
                outputs["loss"] = tf.identity(outputs["loss"])
            metrics = None
            builder._add_train_op(train_op)  # noqa: SLF001 - as tf.estimator did
            output_class = export_output.TrainOutput
        else:
            with tf.control_dependencies(assigns):
                updated = {k: tf.identity(v) for k, v in outputs.get("metrics", {}).items()}
            metrics = {k: (v, v) for k, v in updated.items()} or None
            output_class = export_output.EvalOutput
        export_outputs = {mode: output_class(loss=outputs["loss"], predictions=predictions,
                                             metrics=metrics)}
        signatures = export_utils.build_all_signature_defs(
            receiver.receiver_tensors, export_outputs, None, serving_only=False)
        local_init = tf.group(tf.compat.v1.local_variables_initializer(),
                              tf.compat.v1.tables_initializer())
        with tf.compat.v1.Session(graph=graph) as session:
            variables.initialise(session, prefix, mode, local_init)
            _add_meta_graph(builder, session, save_variables,
                            tags=export_utils.EXPORT_TAG_MAP[mode],
                            signature_def_map=signatures, legacy_init_op=local_init,
                            strip_default_attrs=strip_default_attrs)


class GraphVariables:
    """The TF1 variables of one export graph standing for the estimator's
    (made as the emitted program asks for them): the global ones restored
    from the checkpoint, the local ones (metric accumulators) initialised
    to the value they start an evaluation with.

    `entry_of(handle)` gives (checkpoint name, is local, variable_store.Entry)
    of the estimator's variable of that resource handle, or None for a
    variable not the estimator's."""

    def __init__(self, entry_of):
        self._entry_of = entry_of
        self._made = {}  # name -> graph variable
        self._restored = {}  # checkpoint name -> graph variable

    def global_step(self):
        step = _tf().compat.v1.train.create_global_step()
        self._made["global_step"] = self._restored["global_step"] = step
        return step

    def stand_in(self, handle):
        tf = _tf()

        found = self._entry_of(handle)
        if found is None:
            return None  # frozen: a variable the model_fn made outside the estimator
        name, local, entry = found
        variable = entry.variable
        if name not in self._made:
            if local:
                made = tf.compat.v1.get_variable(
                    name, initializer=tf.constant(entry.initial_value), trainable=False,
                    collections=[tf.compat.v1.GraphKeys.LOCAL_VARIABLES], use_resource=True)
            else:
                made = tf.compat.v1.get_variable(
                    name, shape=variable.shape, dtype=variable.dtype,
                    initializer=tf.compat.v1.zeros_initializer(),
                    trainable=variable.trainable, use_resource=True)
                self._restored[name] = made
            self._made[name] = made
        return self._made[name]

    def initialise(self, session, prefix, mode, local_init):
        tf = _tf()

        try:
            tf.compat.v1.train.Saver(var_list=self._restored).restore(session, prefix)
        except tf.errors.NotFoundError as error:
            raise ValueError(
                "Could not load all requested variables from the checkpoint. Please make "
                "sure your model_fn does not expect variables that were not saved in the "
                f"checkpoint.\n\nEncountered error with mode `{mode}` while restoring "
                f"checkpoint from: `{prefix}`. Full Traceback:\n\n{error}") from error
        session.run(local_init)


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
