"""IPUEstimator: tf.estimator's contract on the simulated IPU.

`model_fn(features, labels, mode, params)` is TensorFlow code; each of
train / evaluate / predict traces it inside a loop of `iterations_per_loop`
steps (`loops.repeat` over an `IPUInfeedQueue` of the `input_fn`'s
dataset, results through an `IPUOutfeedQueue`), and the TensorFlow front
end's bridge (keras_ipu/frontends/tensorflow) compiles that loop into one
executable for the configured IPU system; every run of it is `iterations_
per_loop` steps. Its variables live in a VariableStore (TF1 variables kept
across traces) and in checkpoints in model_dir (checkpoints.py: written
atomically; a new estimator on the directory resumes from the latest).

As in Graphcore's IPUEstimator, the host increments the global step by
iterations_per_loop after each loop, so the model_fn must not increment it
(`minimize(loss)` without `global_step`), and hooks run once per loop.

Replication (num_replicas): the loop runs on that many replicas, replica r
of a step reading the dataset's element step * num_replicas + r; the
results come back replicas merged (_LoopProgram.results). Sharding
(num_shards): the model_fn marks its ops with scopes.ipu_shard, which the
front end's importer reads back from the HLO, so the loop compiles placed
over num_shards IPUs (frontends/tensorflow/function.py).
"""

import inspect
import math
import os
import time

import numpy as np
from absl import logging

from keras_ipu.estimators import checkpoints
from keras_ipu.estimators import hooks as hook_lib
from keras_ipu.estimators import saved_model_export
from keras_ipu.estimators.run_config import RunConfig
from keras_ipu.estimators.run_config import resolve_model_dir
from keras_ipu.estimators.spec import ModeKeys
from keras_ipu.estimators.variable_store import VariableStore
from keras_ipu.ops import cross_replica_ops

_GLOBAL_STEP_INCREMENTED = (
    "Illegal increment of the `global_step` variable in the `model_fn`. This is "
    "usually caused by passing it as an argument to the `Optimizer.minimize()` "
    "function. Please remove this argument as the IPUEstimator itself is "
    "responsible for incrementing it.")


_NOT_REPLICATED = (
    "This is not a valid replicated training graph because no CrossReplicaSum "
    "operations were found. Did you remember to use the "
    "`tensorflow.python.ipu.optimizers.CrossReplicaOptimizer` optimizer?")


class IPUEstimator:
    """Estimator with IPU support (see the module doc and Graphcore's
    IPUEstimator: model_fn, model_dir, config (a RunConfig), params,
    warm_start_from (a checkpoint path), train/eval/predict_batch_size
    (global batch sizes, passed to input_fn and model_fn as
    params['batch_size'] divided by the replicas))."""

    def __init__(self, model_fn, model_dir=None, config=None, params=None,
                 warm_start_from=None, train_batch_size=None, eval_batch_size=None,
                 predict_batch_size=None):
        if not callable(model_fn):
            raise ValueError(f"model_fn must be callable, got {model_fn!r}.")
        if config is None:
            config = RunConfig()
        if not isinstance(config, RunConfig):
            raise ValueError(
                "`config` must be a `tensorflow.python.ipu.ipu_run_config.RunConfig` "
                f"(keras_ipu.ipu_run_config.RunConfig), got {type(config).__name__}.")
        self._model_fn = model_fn
        self._config = config
        self._params = dict(params or {})
        self._model_dir = resolve_model_dir(model_dir, config)
        self._warm_start_from = warm_start_from
        self._batch_sizes = {ModeKeys.TRAIN: train_batch_size, ModeKeys.EVAL: eval_batch_size,
                             ModeKeys.PREDICT: predict_batch_size}
        ipu = config.ipu_run_config
        for mode, size in self._batch_sizes.items():
            if size is not None and size % ipu.num_replicas:
                raise ValueError(
                    f"{mode} batch size {size} must be divisible by the number of "
                    f"replicas {ipu.num_replicas}.")
        self._store = VariableStore()
        self._initialised = set()  # store keys given their starting value
        self._system_configured = False
        checkpoints.remove_orphans(self._model_dir)

    # -- properties of tf.estimator.Estimator --------------------------------

    @property
    def model_dir(self):
        return self._model_dir

    @property
    def config(self):
        return self._config

    @property
    def params(self):
        return dict(self._params)

    @property
    def model_fn(self):
        return self._model_fn

    def latest_checkpoint(self):
        return checkpoints.latest(self._model_dir)

    def get_variable_names(self):
        import tensorflow as tf

        prefix = self._require_checkpoint()
        return [name for name, _ in tf.train.list_variables(prefix)]

    def get_variable_value(self, name):
        import tensorflow as tf

        prefix = self._require_checkpoint()
        return tf.train.load_checkpoint(prefix).get_tensor(name)

    def _require_checkpoint(self):
        prefix = self.latest_checkpoint()
        if prefix is None:
            raise ValueError(
                f"Estimator is not trained yet (no checkpoint in {self._model_dir}). "
                "Train the estimator first.")
        return prefix

    def eval_dir(self, name=None):
        return os.path.join(self._model_dir, "eval" if not name else "eval_" + name)

    # -- SavedModel export (saved_model_export.py) -----------------------------

    def export_saved_model(self, export_dir_base, serving_input_receiver_fn, assets_extra=None,
                           as_text=False, checkpoint_path=None,
                           experimental_mode=ModeKeys.PREDICT):
        """Export the model_fn's graph of `experimental_mode` (PREDICT: on
        the serving input receiver's features) with the checkpoint's
        (default: the latest) values, as a SavedModel under
        export_dir_base/<timestamp>; returns that directory (bytes)."""
        if not serving_input_receiver_fn:
            raise ValueError(saved_model_export._NO_SERVING_INPUT)  # noqa: SLF001
        return self._export(export_dir_base, {experimental_mode: serving_input_receiver_fn},
                            assets_extra, as_text, checkpoint_path, True)

    def export_savedmodel(self, export_dir_base, serving_input_receiver_fn, assets_extra=None,
                          as_text=False, checkpoint_path=None, strip_default_attrs=False):
        """Deprecated name of export_saved_model (which strips default
        attributes always)."""
        import warnings

        warnings.warn("export_savedmodel (from tensorflow_estimator) is deprecated and will "
                      "be removed in a future version. Instructions for updating: This "
                      "function has been renamed, use `export_saved_model` instead.",
                      DeprecationWarning, stacklevel=2)
        if not serving_input_receiver_fn:
            raise ValueError(saved_model_export._NO_SERVING_INPUT)  # noqa: SLF001
        return self._export(export_dir_base, {ModeKeys.PREDICT: serving_input_receiver_fn},
                            assets_extra, as_text, checkpoint_path, strip_default_attrs)

    def experimental_export_all_saved_models(self, export_dir_base, input_receiver_fn_map,
                                             assets_extra=None, as_text=False,
                                             checkpoint_path=None):
        """One SavedModel holding a MetaGraph per mode of
        input_receiver_fn_map ({mode: input receiver fn}; TRAIN and EVAL
        take supervised receivers); see saved_model_export's module doc."""
        return self._export(export_dir_base, input_receiver_fn_map, assets_extra, as_text,
                            checkpoint_path, True)

    def _export(self, export_dir_base, receiver_fns, assets_extra, as_text, checkpoint_path,
                strip_default_attrs):
        saved_model_export.check_receiver_fn_map(receiver_fns)
        self._prepare()
        prefix = checkpoint_path or self.latest_checkpoint()
        if prefix is None:
            raise ValueError(f"Couldn't find trained model at {self._model_dir}.")
        return saved_model_export.export(
            export_dir_base, receiver_fns, self, prefix, assets_extra=assets_extra,
            as_text=as_text, strip_default_attrs=strip_default_attrs)

    def export_batch_size(self, mode):
        """The batch size (per replica) an export of `mode` fills an open
        batch dimension with, or None."""
        return self._mode_params(mode).get("batch_size")

    def variable_entry(self, handle):
        """(checkpoint name, is local, the variable) of the one of this
        estimator's variables whose resource handle is `handle`, or None."""
        from keras_ipu.estimators.variable_store import is_local

        for name, entry in self._store.named().items():
            if entry.variable.handle is handle:
                return name, is_local(entry), entry
        return None

    def serving_outputs(self, features):
        """(predictions, export_outputs) of the model_fn in PREDICT mode on
        `features`, inside a trace."""
        spec = self.call_model_fn(features, None, ModeKeys.PREDICT)
        return spec.predictions, getattr(spec, "export_outputs", None)

    def supervised_outputs(self, features, labels, mode):
        """Inside a trace, the model_fn in TRAIN or EVAL mode: {"loss" (after
        the train op), "predictions", "metrics": {name: the metric after
        its update}} (what a TRAIN or EVAL export's signature gives)."""
        import tensorflow as tf

        global_step = self.global_step_variable()
        spec = self.call_model_fn(features, labels, mode)
        if mode == ModeKeys.TRAIN:
            _check_global_step_not_incremented(global_step)
            with tf.control_dependencies([spec.train_op]):
                loss = tf.identity(spec.loss)
        else:
            loss = spec.loss
        outputs = {"loss": loss, "metrics": _updated_metrics(spec.eval_metric_ops)}
        if spec.predictions is not None and not (isinstance(spec.predictions, dict)
                                                 and not spec.predictions):
            outputs["predictions"] = spec.predictions
        return outputs

    def emitted_predict_model(self, features, specs, prefix):
        """The model part of a PREDICT export: the PREDICT model_fn on
        features of `specs`, compiled through the front end with checkpoint
        `prefix` restored into its variables, emitted as TensorFlow ops
        (frozen variables); a function of the flat features returning
        {signature key: (ExportOutput class, {field: tensor})}."""
        import tensorflow as tf

        from keras_ipu.export.serving_export import emitted_step
        from keras_ipu.frontends.tensorflow.function import bridge

        classes = {}  # signature key -> ExportOutput class, found by the trace
        store = self._store

        def serving_model(*flat):
            with store.trace():
                self.global_step_variable()
                predictions, export_outputs = self.serving_outputs(
                    tf.nest.pack_sequence_as(features, list(flat)))
                traced = saved_model_export.traced_export_outputs(export_outputs, predictions)
            classes.update({key: cls for key, (cls, _) in traced.items()})
            return {key: fields for key, (_, fields) in traced.items()}

        serving_model.__name__ = "ipu_estimator_serving_model"
        # Trace first: the model_fn makes its variables, which then take the
        # checkpoint's values for the emitted program to freeze. The
        # estimator's own values come back afterwards, so an export of an
        # older checkpoint does not rewind training.
        bridge(serving_model).concrete(*[tf.zeros(s.shape, s.dtype) for s in specs])
        self._initialise_new_variables()
        variables = self._store.saveable()
        kept = {name: v.numpy() for name, v in variables.items()}
        checkpoints.restore(prefix, variables)
        try:
            step = emitted_step(serving_model, specs)
        finally:
            for name, value in kept.items():
                variables[name].assign(value)

        def model(*flat):
            return {key: (classes[key], fields) for key, fields in step(*flat).items()}

        return model

    def emitted_supervised_step(self, mode, features, labels, specs):
        """The model part of a TRAIN or EVAL export: the model_fn in `mode`
        on features and labels of `specs` (two lists), compiled through the
        front end and emitted as TensorFlow ops reading and writing the
        export graph's variables: `step(graph_variable, *features_then_
        labels)` returns (supervised_outputs' dict, the variables' assign
        ops); see serving_export.emitted_stateful_step. The variables'
        values are the export graph's (restored from the checkpoint there)."""
        import tensorflow as tf

        from keras_ipu.export.serving_export import emitted_stateful_step

        store = self._store
        n_features = len(specs[0])

        def supervised_model(*flat):
            with store.trace():
                return self.supervised_outputs(
                    tf.nest.pack_sequence_as(features, list(flat[:n_features])),
                    tf.nest.pack_sequence_as(labels, list(flat[n_features:])), mode)

        supervised_model.__name__ = f"ipu_estimator_{mode}_export_model"
        step = emitted_stateful_step(supervised_model, specs[0] + specs[1])
        # Variables made by the trace (optimizer slots) take their values as
        # for a run, so the estimator's state stays as training left it.
        self._initialise_new_variables()
        return step

    # -- the three modes ------------------------------------------------------

    def train(self, input_fn, hooks=None, steps=None, max_steps=None, saving_listeners=None):
        """Train for `steps` more steps, or until the global step reaches
        `max_steps`, in loops of iterations_per_loop steps. Returns self."""
        if steps is not None and max_steps is not None:
            raise ValueError("Can not provide both steps and max_steps.")
        if steps is not None and steps <= 0:
            raise ValueError(f"Must specify steps > 0, given: {steps}")
        if max_steps is not None and max_steps <= 0:
            raise ValueError(f"Must specify max_steps > 0, given: {max_steps}")
        if steps is None and max_steps is None:
            raise ValueError(
                "IPUEstimator.train needs steps or max_steps: the dataset is streamed "
                "to the IPU in whole loops and its end is not seen by the device.")
        if saving_listeners:
            raise NotImplementedError(
                "saving_listeners (CheckpointSaverListener) are not supported by "
                "keras_ipu's IPUEstimator.")
        ipl = self._config.ipu_run_config.iterations_per_loop
        self._validate_steps(steps)
        self._prepare()
        start = self._global_step_value()
        final = start + steps if steps is not None else max_steps
        if start >= final:
            logging.info("Skipping training since max_steps has already saved.")
            return self
        loops = math.ceil((final - start) / ipl)

        program = self._program(ModeKeys.TRAIN, input_fn)
        all_hooks = list(hooks or ()) + list(program.spec_hooks)
        for hook in all_hooks:
            hook.begin()
        writer = self._summary_writer(self._model_dir)
        last_save_time, last_save_step = time.time(), start
        last_summary_step = start
        step = start
        for _ in range(loops):
            hook_lib.call_before_run(all_hooks, hook_lib.RunContext(step, ipl))
            t0 = time.time()
            program()
            step = self._add_to_global_step(ipl)
            losses = program.results()["loss"]
            if not np.all(np.isfinite(losses)):
                raise FloatingPointError(
                    f"Loss is {losses[~np.isfinite(losses)][0]} at global step {step}: "
                    "the model diverged (tf.estimator's NanLossDuringTrainingError).")
            if step - last_summary_step >= self._config.save_summary_steps or step >= final:
                with writer.as_default(step=step):
                    import tensorflow as tf

                    tf.summary.scalar("loss", losses[-1])
                    tf.summary.scalar("global_step/sec", ipl / max(time.time() - t0, 1e-9))
                writer.flush()
                last_summary_step = step
            if self._config.log_step_count_steps and (step // ipl) % max(
                    1, self._config.log_step_count_steps // ipl) == 0:
                logging.info("loss = %s, step = %d", losses[-1], step)
            context = hook_lib.RunContext(step, ipl)
            hook_lib.call_after_run(all_hooks, context)
            if self._checkpoint_due(step, last_save_step, last_save_time) and step < final:
                self._save(step)
                last_save_time, last_save_step = time.time(), step
            if context.stop_requested:
                break
        self._save(step)
        for hook in all_hooks:
            hook.end(None)
        writer.close()
        return self

    def evaluate(self, input_fn, steps=None, hooks=None, checkpoint_path=None, name=None):
        """Run `steps` evaluation steps; returns {metric: value, 'loss': mean
        loss, 'global_step': step of the evaluated variables}."""
        if steps is None:
            raise ValueError(
                "IPUEstimator.evaluate needs steps: the dataset is streamed to the IPU "
                "in whole loops and its end is not seen by the device.")
        if steps <= 0:
            raise ValueError(f"Must specify steps > 0, given: {steps}")
        self._validate_steps(steps)
        self._prepare()
        program = self._program(ModeKeys.EVAL, input_fn)
        self._restore_for_inference(checkpoint_path)
        self._store.reset_local_variables()
        all_hooks = list(hooks or ()) + list(program.spec_hooks)
        for hook in all_hooks:
            hook.begin()
        ipl = self._config.ipu_run_config.iterations_per_loop
        losses, metrics = [], {}
        step = self._global_step_value()
        for _ in range(steps // ipl):
            hook_lib.call_before_run(all_hooks, hook_lib.RunContext(step, ipl))
            program()
            out = program.results()
            losses.append(out["loss"])
            # The last update's value is the metric over the loop.
            metrics = {k: v[-1] for k, v in out["metrics"].items()}
            hook_lib.call_after_run(all_hooks, hook_lib.RunContext(step, ipl))
        for hook in all_hooks:
            hook.end(None)
        results = dict(metrics)
        results["loss"] = np.float32(np.mean(np.concatenate(losses)))
        results["global_step"] = np.int64(step)
        writer = self._summary_writer(self.eval_dir(name))
        with writer.as_default(step=step):
            import tensorflow as tf

            for key, value in results.items():
                if key != "global_step" and np.ndim(value) == 0:
                    tf.summary.scalar(key, value)
        writer.close()
        return results

    def predict(self, input_fn, predict_keys=None, hooks=None, checkpoint_path=None,
                yield_single_examples=True, num_predictions=None):
        """Yield predictions, one loop of iterations_per_loop batches per
        executable run; stops after num_predictions (single examples, or
        batches when yield_single_examples=False) or when the dataset ends."""
        self._prepare()
        program = self._program(ModeKeys.PREDICT, input_fn)
        self._restore_for_inference(checkpoint_path)
        all_hooks = list(hooks or ()) + list(program.spec_hooks)
        return self._predictions(program, predict_keys, all_hooks, yield_single_examples,
                                 num_predictions)

    def _predictions(self, program, predict_keys, all_hooks, single, limit):
        for hook in all_hooks:
            hook.begin()
        ipl = self._config.ipu_run_config.iterations_per_loop
        produced = 0
        step = self._global_step_value()
        try:
            while limit is None or produced < limit:
                hook_lib.call_before_run(all_hooks, hook_lib.RunContext(step, ipl))
                try:
                    program()
                except Exception as error:  # noqa: BLE001 - the end of a finite dataset
                    if _is_end_of_data(error):
                        return
                    raise
                out = program.results()["predictions"]
                hook_lib.call_after_run(all_hooks, hook_lib.RunContext(step, ipl))
                for batch in _per_step(out, predict_keys):
                    for item in (_per_example(batch) if single else [batch]):
                        if limit is not None and produced >= limit:
                            return
                        produced += 1
                        yield item
        finally:
            for hook in all_hooks:
                hook.end(None)

    # -- the compiled loop ----------------------------------------------------

    def _program(self, mode, input_fn):
        """A _LoopProgram of `mode` over input_fn's dataset, traced now (its
        variables made and initialised)."""
        dataset = self._call_input_fn(input_fn, mode)
        program = self._loop_program(mode, dataset)
        program.trace()
        self._initialise_new_variables()
        return program

    def _loop_program(self, mode, dataset):
        return _LoopProgram(self, mode, dataset)

    def _call_input_fn(self, input_fn, mode):
        import tensorflow as tf

        dataset = input_fn(**self._context_kwargs(_arg_names(input_fn), mode))
        if not isinstance(dataset, tf.data.Dataset):
            raise ValueError(
                f"input_fn must return a tf.data.Dataset, got {type(dataset).__name__}.")
        return dataset

    def _context_kwargs(self, names, mode):
        """What the estimator passes to an input_fn or model_fn that names
        them: `mode`, `params` (with this mode's batch size) and `config`."""
        context = {"mode": lambda: mode, "params": lambda: self._mode_params(mode),
                   "config": lambda: self._config}
        return {name: make() for name, make in context.items() if name in names}

    def _mode_params(self, mode):
        params = dict(self._params)
        size = self._batch_sizes[mode]
        if size is not None:
            params["batch_size"] = size // self._config.ipu_run_config.num_replicas
        return params

    def call_model_fn(self, features, labels, mode):
        """model_fn(features, labels, mode, params, config) with the
        arguments it names; its IPUEstimatorSpec."""
        names = _arg_names(self._model_fn)
        kwargs = self._context_kwargs(names, mode)
        if "labels" in names:
            kwargs["labels"] = labels
        elif labels is not None:
            raise ValueError("model_fn does not take labels, but input_fn returns labels.")
        spec = self._model_fn(features=features, **kwargs)
        for field in ("mode", "loss", "train_op", "predictions", "eval_metric_ops"):
            if not hasattr(spec, field):
                raise ValueError(
                    "model_fn should return an IPUEstimatorSpec, got "
                    f"{type(spec).__name__}.")
        if getattr(spec, "eval_metrics", None) is not None:
            raise NotImplementedError(
                "IPUEstimatorSpec.eval_metrics (a metric function run on the host) is "
                "not supported by keras_ipu's IPUEstimator: use eval_metric_ops "
                "(tf.compat.v1.metrics pairs, run on the IPU).")
        if getattr(spec, "host_call", None) is not None:
            raise NotImplementedError(
                "IPUEstimatorSpec.host_call is not supported by keras_ipu's IPUEstimator.")
        return spec

    # -- variables, the global step, checkpoints ------------------------------

    def _prepare(self):
        if self._system_configured:
            return
        options = self._config.ipu_run_config.ipu_options
        if options is not None:
            options.configure_ipu_system()
        self._system_configured = True
        if self._config.tf_random_seed is not None:
            import tensorflow as tf

            tf.random.set_seed(self._config.tf_random_seed)

    def global_step_variable(self):
        """Called in every trace, so the model_fn finds the global step."""
        import tensorflow as tf

        return tf.compat.v1.train.get_or_create_global_step()

    def _global_step_entry(self):
        for (name, _), entry in self._store.entries.items():
            if name == "global_step":
                return entry.variable
        return None

    def _global_step_value(self):
        variable = self._global_step_entry()
        if variable is not None:
            return int(variable.numpy())
        prefix = self.latest_checkpoint()
        if prefix is None:
            return 0
        import tensorflow as tf

        return int(tf.train.load_checkpoint(prefix).get_tensor("global_step"))

    def _add_to_global_step(self, n):
        variable = self._global_step_entry()
        return int(variable.assign_add(n).numpy())

    def _initialise_new_variables(self):
        """Variables made by the last trace take their value from the latest
        checkpoint in model_dir (else from warm_start_from, else their
        initializers)."""
        fresh = {name: v for name, v in self._store.saveable().items()
                 if id(v) not in self._initialised}
        if not fresh:
            return
        prefix = self.latest_checkpoint()
        if prefix is not None:
            checkpoints.restore(prefix, fresh)
        elif self._warm_start_from is not None:
            self._warm_start(fresh)
        self._initialised.update(id(v) for v in fresh.values())

    def _warm_start(self, fresh):
        import tensorflow as tf

        source = self._warm_start_from
        if not isinstance(source, (str, os.PathLike)):
            raise NotImplementedError(
                "warm_start_from takes a checkpoint path in keras_ipu's IPUEstimator "
                "(WarmStartSettings are not supported).")
        source = os.fspath(source)
        prefix = tf.train.latest_checkpoint(source) if os.path.isdir(source) else source
        if prefix is None:
            raise ValueError(f"warm_start_from={source!r} holds no checkpoint.")
        stored = tf.train.load_checkpoint(prefix).get_variable_to_shape_map()
        checkpoints.restore(prefix, {n: v for n, v in fresh.items()
                                     if n in stored and n != "global_step"})

    def _restore_for_inference(self, checkpoint_path):
        prefix = checkpoint_path or self.latest_checkpoint()
        if prefix is not None:
            checkpoints.restore(prefix, self._store.saveable())

    def _checkpoint_due(self, step, last_step, last_time):
        if self._config.save_checkpoints_steps is not None:
            return step - last_step >= self._config.save_checkpoints_steps
        return time.time() - last_time >= self._config.save_checkpoints_secs

    def _save(self, step):
        prefix = checkpoints.save(self._model_dir, self._store.saveable(), step,
                                  keep_checkpoint_max=self._config.keep_checkpoint_max)
        logging.info("Saving checkpoints for %d into %s.", step, prefix)

    def _summary_writer(self, directory):
        import tensorflow as tf

        return tf.summary.create_file_writer(directory)

    def _validate_steps(self, steps):
        ipl = self._config.ipu_run_config.iterations_per_loop
        if steps is not None and steps % ipl != 0:
            raise ValueError(
                f"steps ({steps}) must be a multiple of iterations_per_loop ({ipl})")


class _LoopProgram:
    """One mode's loop over one dataset: a function of TensorFlow ops the
    bridge compiles (one executable run per call)."""

    def __init__(self, estimator, mode, dataset):
        from keras_ipu.ipu_infeed_queue import IPUInfeedQueue
        from keras_ipu.ipu_outfeed_queue import IPUOutfeedQueue

        self.estimator = estimator
        self.mode = mode
        self.infeed = IPUInfeedQueue(dataset)
        self.outfeed = IPUOutfeedQueue()
        self.spec_hooks = ()
        self.replicas = estimator.config.ipu_run_config.num_replicas
        self._bridged = None

    def _loop(self):
        import tensorflow as tf

        from keras_ipu import loops

        estimator = self.estimator
        ipl = estimator.config.ipu_run_config.iterations_per_loop
        mode = self.mode
        store = estimator._store  # noqa: SLF001 - the estimator's own store

        def body(*element, **named):
            features, labels = _features_and_labels(element, named, mode)
            global_step = estimator.global_step_variable()
            spec = estimator.call_model_fn(features, labels, mode)
            self.spec_hooks = {ModeKeys.TRAIN: spec.training_hooks,
                               ModeKeys.EVAL: spec.evaluation_hooks,
                               ModeKeys.PREDICT: spec.prediction_hooks}[mode]
            if mode == ModeKeys.TRAIN:
                _check_global_step_not_incremented(global_step)
                if self.replicas > 1 and cross_replica_ops.reductions_traced() == reductions_before:
                    raise ValueError(_NOT_REPLICATED)
                with tf.control_dependencies([spec.train_op]):
                    loss = tf.identity(spec.loss)
                return self.outfeed.enqueue({"loss": loss})
            if mode == ModeKeys.EVAL:
                return self.outfeed.enqueue({"loss": spec.loss, "metrics": _updated_metrics(
                    spec.eval_metric_ops)})
            return self.outfeed.enqueue({"predictions": spec.predictions})

        reductions_before = cross_replica_ops.reductions_traced()

        def loop():
            with store.trace():
                loops.repeat(ipl, body, [], self.infeed)  # the while op; kept as stateful

        loop.__name__ = f"ipu_estimator_{mode}_loop"
        return loop

    def trace(self):
        from keras_ipu.frontends.tensorflow.function import bridge

        self._bridged = bridge(self._loop())
        self._bridged.concrete()

    def __call__(self):
        self._bridged.run((), {}, replicas=self.replicas)

    def results(self):
        """What the last run sent, replicas merged: {"loss": per step (NumPy,
        the replicas' mean)} (train), {"loss", "metrics": {name: per step}}
        (eval; replicas saw equal shares of the data, so their metrics are
        averaged), {"predictions": the replicas' batches one after the
        other} (predict)."""
        out = self.outfeed.dequeue()
        merged = {}
        if "loss" in out:
            merged["loss"] = _replica_mean(out["loss"].numpy(), self.replicas)
        if "metrics" in out:
            merged["metrics"] = {k: _replica_mean(v.numpy(), self.replicas)
                                 for k, v in out["metrics"].items()}
        if "predictions" in out:
            merged["predictions"] = _replica_batches(out["predictions"], self.replicas)
        return merged


def _replica_mean(values, replicas):
    """Per-step values of an outfeed: with replication the replica axis
    (after the step axis) is averaged."""
    return values.mean(axis=1) if replicas > 1 else values


def _replica_batches(out, replicas):
    """Predictions [steps, replicas, batch, ...] as [steps * replicas,
    batch, ...]: replica r of step t had the dataset's batch t * replicas + r."""
    import tensorflow as tf

    if replicas == 1:
        return out
    return tf.nest.map_structure(
        lambda v: tf.reshape(v, [-1] + v.shape.as_list()[2:]), out)


def _updated_metrics(eval_metric_ops):
    """{name: the metric's value after its update op} of tf.compat.v1.metrics
    (value, update) pairs (an update given as an op is run first)."""
    import tensorflow as tf

    updated = {}
    for key, (value, update) in (eval_metric_ops or {}).items():
        if isinstance(update, tf.Operation):
            with tf.control_dependencies([update]):
                update = tf.identity(value)
        updated[key] = update
    return updated


def _features_and_labels(element, named, mode):
    if named:
        return named, None
    if len(element) == 1:
        if mode != ModeKeys.PREDICT:
            raise ValueError(
                "input_fn's dataset gives one value per element; training and "
                "evaluation need (features, labels).")
        return element[0], None
    if len(element) == 2:
        return element[0], (element[1] if mode != ModeKeys.PREDICT else None)
    raise ValueError(
        f"input_fn's dataset elements have {len(element)} parts; expected features "
        "or (features, labels).")


def _check_global_step_not_incremented(global_step):
    """Graphcore's check: no op of the traced model_fn writes the global step."""
    import tensorflow as tf

    graph = tf.compat.v1.get_default_graph()
    handles = _internal_handles(graph, global_step.handle)
    for op in graph.get_operations():
        if op.type in ("AssignAddVariableOp", "AssignVariableOp") and \
                any(op.inputs[0] is h for h in handles):
            raise ValueError(_GLOBAL_STEP_INCREMENTED)


def _internal_handles(graph, handle):
    """The tensors that stand for the eager `handle` inside `graph` (a
    function graph captures it from its outer graph)."""
    outer = getattr(graph, "outer_graph", None)
    found = [handle]
    if outer is not None and hasattr(outer, "captures"):
        found += _internal_handles(outer, handle)
    inside = []
    for external, internal in getattr(graph, "captures", ()):
        if any(external is f for f in found):
            inside.append(internal)
    return found + inside


def _arg_names(fn):
    try:
        return set(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return set()


def _is_end_of_data(error):
    import tensorflow as tf

    return isinstance(error, (tf.errors.OutOfRangeError, StopIteration)) or \
        "end of" in str(error).lower() and "dataset" in str(error).lower()


def _per_step(out, predict_keys):
    import tensorflow as tf

    if isinstance(out, dict):
        if predict_keys:
            missing = sorted(set(predict_keys) - set(out))
            if missing:
                raise ValueError(f"Expected to run at least one output from {missing}, "
                                 f"provided {sorted(out)}.")
            out = {k: out[k] for k in predict_keys}
        n = int(next(iter(out.values())).shape[0])
        for i in range(n):
            yield {k: v[i].numpy() for k, v in out.items()}
    else:
        for i in range(int(tf.shape(out)[0])):
            yield out[i].numpy()


def _per_example(batch):
    if isinstance(batch, dict):
        n = len(next(iter(batch.values())))
        for i in range(n):
            yield {k: v[i] for k, v in batch.items()}
    else:
        yield from batch
