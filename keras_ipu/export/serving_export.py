"""Graphcore's `serving.export_single_step` on keras_ipu: the predict step
as the simulated IPU runs it, written as a SavedModel TensorFlow serves.

The step (TensorFlow code) goes through the TensorFlow front end as for a
run (XLA's HLO imported into the keras_ipu IR); that program is emitted
back as TensorFlow ops by the emitter of keras_ipu/device/to_tensorflow
(the one `model.export` uses), its variables frozen into constants as
Graphcore's export freezes them, between the optional CPU pre- and
post-processing functions. Graphcore's SavedModel holds a Poplar
executable run by the embedded runtime; this one holds the emitted
TensorFlow graph, so any TensorFlow runs it (no IPU, no keras_ipu).
"""

import os
import shutil
import uuid


def _check_signature(signature, what):
    import tensorflow as tf

    if signature is None:
        return None
    if not isinstance(signature, (list, tuple)) or not all(
            isinstance(s, tf.TensorSpec) for s in tf.nest.flatten(signature)):
        raise TypeError(
            f"{what} must be a tuple or a list of tf.TensorSpec objects or None, got "
            f"{signature!r}.")
    if not signature:
        raise ValueError(f"{what} must not be an empty tuple or list.")
    return list(signature)


def _signature_of(fn, given, input_dataset, what):
    import tensorflow as tf

    given = _check_signature(given, what)
    if given is not None:
        return given
    if input_dataset is not None:
        if not isinstance(input_dataset, tf.data.Dataset):
            raise TypeError(
                f"input_dataset must be a tf.data.Dataset or None, got "
                f"{type(input_dataset).__name__}.")
        spec = input_dataset.element_spec
        return list(spec) if isinstance(spec, tuple) else [spec]
    declared = getattr(fn, "input_signature", None)
    if declared:
        return list(declared)
    raise ValueError(
        f"{what} is needed: pass it, or an input_dataset, or a tf.function with an "
        "input_signature.")


def _prepare_dir(export_dir, purge_export_dir):
    if os.path.isdir(export_dir) and os.listdir(export_dir):
        if not purge_export_dir:
            raise ValueError(
                f"Directory '{export_dir}' is not empty. Pass purge_export_dir=True "
                "to empty it first, or choose another directory.")


def emitted_step(predict_step, signature):
    """A function of tensors running predict_step as the front end compiles
    it, emitted as TensorFlow ops with its variables frozen."""
    step = emitted_stateful_step(predict_step, signature)

    def frozen(*args):
        outputs, _ = step(lambda handle: None, *args)
        return outputs

    return frozen


def emitted_stateful_step(fn, signature):
    """`fn` as the front end compiles it (now), emitted as TensorFlow ops:
    `step(graph_variable, *tensors)` returns (fn's outputs, the assign ops
    of the variables it updates). Called in the graph being built, it asks
    `graph_variable(handle)`, for the resource handle of each variable
    the program reads, for the variable of that graph standing for it (read
    where the program reads the variable, assigned what the program writes
    into it), or None to freeze the variable's value at compile time into a
    constant."""
    import numpy as np
    import tensorflow as tf

    from keras_ipu.device.to_tensorflow import emit_graph
    from keras_ipu.device.to_tensorflow import missing_rules
    from keras_ipu.frontends.tensorflow.captured_variables import is_resource
    from keras_ipu.frontends.tensorflow.function import _pack
    from keras_ipu.frontends.tensorflow.function import bridge

    examples = [tf.zeros(s.shape, s.dtype) for s in signature]
    bridged = bridge(fn)
    _, inputs, arrays, program = bridged.program(examples)
    missing = missing_rules(program.graph)
    if missing:
        raise NotImplementedError(
            f"The step uses {sorted(missing)}, which the TensorFlow emitter "
            "cannot write as TensorFlow ops, so it cannot be exported.")
    n_args = len(examples)
    captured = {i: (inputs[i] if is_resource(inputs[i]) else None, np.asarray(arrays[i]))
                for i in program.param_inputs if i >= n_args}

    def step(graph_variable, *args):
        flat = [tf.convert_to_tensor(a) for a in tf.nest.flatten(list(args))]
        live = {i: graph_variable(handle) for i, (handle, _) in captured.items()
                if handle is not None}
        live = {i: target for i, target in live.items() if target is not None}
        feed = [flat[i] if i < n_args else
                live[i].read_value() if i in live else tf.constant(captured[i][1])
                for i in program.param_inputs]
        if program.uses_token:
            feed.append(tf.zeros((), tf.uint32))
        outputs = emit_graph(program.graph, feed)
        updated = [(out, live[i]) for out, i in program.updates if i in live]
        # A TF1 graph orders a read and a write of one variable only by
        # their dependencies: every read and result comes before any write.
        with tf.control_dependencies(feed + list(outputs) if updated else []):
            assigns = [target.assign(outputs[out], read_value=False)
                       for out, target in updated]
        return _pack(program.structured_outputs, list(outputs[:program.n_outputs])), assigns

    return step


def _named(outputs, output_names):
    import tensorflow as tf

    leaves = tf.nest.flatten(outputs)
    if output_names is None:
        names = [f"output_{i}" for i in range(len(leaves))]
    else:
        names = [output_names] if isinstance(output_names, str) else list(output_names)
        if len(names) != len(leaves):
            raise ValueError(
                f"output_names has {len(names)} names for the {len(leaves)} outputs of "
                "the exported function.")
    return dict(zip(names, leaves))



def _check_iterations(iterations):
    if not isinstance(iterations, int) or isinstance(iterations, bool) or iterations < 1:
        raise ValueError(f"iterations must be a positive integer, got {iterations!r}.")


def _check_restoring(variable_initializer, checkpoint_restore_dir):
    if variable_initializer is not None:
        raise NotImplementedError(
            "variable_initializer takes a TF1 tf.Session, which keras_ipu has no "
            "use for: restore the variables before exporting (the export freezes "
            "their current values).")
    if checkpoint_restore_dir is not None:
        raise NotImplementedError(
            "checkpoint_restore_dir is not supported by keras_ipu's export: restore "
            "the variables before exporting (the export freezes their current values).")


def _preprocessed(preprocessing_step, preprocessing_step_signature, input_dataset):
    """(the SavedModel's input signature, the preprocessing tf.function, the
    signature of what it hands the IPU step)."""
    import tensorflow as tf

    outer = _signature_of(preprocessing_step, preprocessing_step_signature, input_dataset,
                          "preprocessing_step_signature")
    pre = tf.function(preprocessing_step, autograph=False)
    produced = pre.get_concrete_function(*outer).structured_outputs
    produced = produced if isinstance(produced, (list, tuple)) else [produced]
    return outer, pre, [tf.TensorSpec(t.shape, t.dtype) for t in produced]


def _checked_export(iterations, variable_initializer, checkpoint_restore_dir,
                    postprocessing_step_signature, export_dir, purge_export_dir):
    """The checks every serving export makes first; the export directory."""
    _check_iterations(iterations)
    _check_restoring(variable_initializer, checkpoint_restore_dir)
    _check_signature(postprocessing_step_signature, "postprocessing_step_signature")
    export_dir = os.fspath(export_dir)
    _prepare_dir(export_dir, purge_export_dir)
    return export_dir


def _signatures(predict_step, predict_step_signature, input_dataset, preprocessing_step,
                preprocessing_step_signature, skip=0):
    """(the SavedModel's input signature, the preprocessing tf.function or
    None, the signature of the IPU step's arguments); `skip`: leading
    arguments of predict_step's own signature that the export supplies."""
    if preprocessing_step is not None:
        return _preprocessed(preprocessing_step, preprocessing_step_signature, input_dataset)
    inner = _signature_of(predict_step, predict_step_signature, input_dataset,
                          "predict_step_signature")[skip:]
    return inner, None, inner


def write_serving_model(step, export_dir, outer, pre=None, postprocessing_step=None,
                        output_names=None):
    """Write the SavedModel serving `pre -> step -> postprocessing_step`
    with input signature `outer` under export_dir (atomically) and return
    its predict function. `step` is a function of TensorFlow tensors (the
    emitted IPU program); `pre` a tf.function or None."""
    import tensorflow as tf

    def serve(*args):
        if pre is not None:
            args = pre(*args)
            args = args if isinstance(args, (list, tuple)) else [args]
        outputs = step(*args)
        if postprocessing_step is not None:
            call = outputs if isinstance(outputs, (list, tuple)) else [outputs]
            outputs = postprocessing_step(*call)
        return _named(outputs, output_names)

    predict = tf.function(serve, input_signature=outer, autograph=False)
    module = tf.Module()
    module.predict = predict
    # Written beside the target and renamed into place: a failed or killed
    # export leaves no half-written SavedModel under export_dir.
    parent = os.path.dirname(os.path.abspath(export_dir))
    os.makedirs(parent, exist_ok=True)
    staging = os.path.join(parent, f".{os.path.basename(export_dir)}.tmp-{uuid.uuid4().hex}")
    try:
        tf.saved_model.save(module, staging, signatures={"serving_default": predict})
        if os.path.isdir(export_dir):
            shutil.rmtree(export_dir)
        os.replace(staging, export_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return predict


def export_single_step(predict_step, export_dir, iterations, predict_step_signature=None,
                       input_dataset=None, variable_initializer=None, output_names=None,
                       preprocessing_step=None, preprocessing_step_signature=None,
                       postprocessing_step=None, postprocessing_step_signature=None,
                       purge_export_dir=False, checkpoint_restore_dir=None):
    """Write the SavedModel (see the module doc) and return its predict
    function."""
    export_dir = _checked_export(iterations, variable_initializer, checkpoint_restore_dir,
                                 postprocessing_step_signature, export_dir, purge_export_dir)
    outer, pre, inner = _signatures(predict_step, predict_step_signature, input_dataset,
                                    preprocessing_step, preprocessing_step_signature)
    return write_serving_model(emitted_step(predict_step, inner), export_dir, outer, pre,
                               postprocessing_step, output_names)


def export_pipeline(computational_stages, export_dir, iterations, inputs=None,
                    device_mapping=None, pipeline_schedule=None, poplar_options=None, name=None,
                    predict_step_signature=None, input_dataset=None, variable_initializer=None,
                    output_names=None, preprocessing_step=None,
                    preprocessing_step_signature=None, postprocessing_step=None,
                    postprocessing_step_signature=None, purge_export_dir=False,
                    checkpoint_restore_dir=None):
    """Graphcore's serving.export_pipeline: the pipeline's inference (each
    element through every stage, `inputs` first), checked as a pipeline of
    `iterations` micro-batches is, emitted as one TensorFlow program with
    frozen variables (one call serves one element, as the embedded runtime
    does) between the optional CPU pre- and post-processing."""
    from keras_ipu.ops.functional_pipeline import check_inference_pipeline
    from keras_ipu.ops.functional_pipeline import inference_step

    export_dir = _checked_export(iterations, variable_initializer, checkpoint_restore_dir,
                                 postprocessing_step_signature, export_dir, purge_export_dir)
    stages = check_inference_pipeline(computational_stages, iterations, device_mapping,
                                      pipeline_schedule, poplar_options)
    fixed = list(inputs or [])
    # A signature given or declared describes every argument of the first
    # stage, `inputs` (baked into the program) first; a dataset's elements
    # are only what the infeed would give.
    skip = len(fixed) if input_dataset is None or predict_step_signature is not None else 0
    outer, pre, inner = _signatures(stages[0], predict_step_signature, input_dataset,
                                    preprocessing_step, preprocessing_step_signature, skip)
    if not inner:
        raise ValueError(
            "predict_step_signature must describe the infeed's arguments of the first "
            "computational stage (after its `inputs`); none are left.")
    step = inference_step(stages, fixed, name=name or "pipeline")
    return write_serving_model(emitted_step(step, inner), export_dir, outer, pre,
                               postprocessing_step, output_names)
