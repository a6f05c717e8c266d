"""IPUPipelineEstimator: the estimator whose model_fn returns pipeline
stages (Graphcore's `ipu_pipeline_estimator`).

Each loop of `iterations_per_loop` mini-batches is one functional pipeline
(keras_ipu/ops/functional_pipeline.py) with repeat_count =
iterations_per_loop / gradient_accumulation_count, compiled through the
TensorFlow front end as IPUEstimator's loops are; the global step counts
mini-batches. Training outfeeds the loss of every mini-batch; evaluation
outfeeds the last stage's outputs and runs `eval_metrics_fn` on the host
over them (as Graphcore's does), its `tf.compat.v1.metrics` accumulating
over the whole evaluation; prediction outfeeds the last stage's outputs.
With num_replicas > 1 each replica runs the pipeline on its own
micro-batches (the optimizer_function's CrossReplicaOptimizer averages the
accumulated gradients, as Graphcore's documentation asks); the host
metrics see every replica's outputs.
"""

import collections

import numpy as np

from keras_ipu.estimators.estimator import IPUEstimator
from keras_ipu.estimators.estimator import _arg_names
from keras_ipu.estimators.estimator import _LoopProgram
from keras_ipu.estimators.estimator import _replica_batches
from keras_ipu.estimators.estimator import _replica_mean
from keras_ipu.estimators.spec import ModeKeys
from keras_ipu.gradient_accumulation import GradientAccumulationReductionMethod

_FIELDS = ("mode", "computational_stages", "gradient_accumulation_count", "eval_metrics_fn",
           "optimizer_function", "device_mapping", "loss_accumulator_dtype", "training_hooks",
           "evaluation_hooks", "prediction_hooks", "reduction_method", "pipeline_op_kwargs")


class IPUPipelineEstimatorSpec(collections.namedtuple("IPUPipelineEstimatorSpec", _FIELDS)):
    """Ops and objects returned from a model_fn and passed to
    IPUPipelineEstimator."""

    def __new__(cls, mode, computational_stages, gradient_accumulation_count=None,
                eval_metrics_fn=None, optimizer_function=None, device_mapping=None,
                loss_accumulator_dtype=None, training_hooks=None, evaluation_hooks=None,
                prediction_hooks=None, reduction_method=GradientAccumulationReductionMethod.SUM,
                **pipeline_op_kwargs):
        if not computational_stages:
            raise ValueError("`IPUPipelineEstimatorSpec` must contain `computational_stages`")
        if mode == ModeKeys.TRAIN and not optimizer_function:
            raise ValueError("`IPUPipelineEstimatorSpec` must contain "
                             "`optimizer_function` when training")
        if mode == ModeKeys.EVAL and not eval_metrics_fn:
            raise ValueError("`IPUPipelineEstimatorSpec` must contain "
                             "`eval_metrics_fn` when evaluating")
        if not gradient_accumulation_count:
            raise ValueError("`IPUPipelineEstimatorSpec` must contain "
                             "`gradient_accumulation_count`")
        if "accumulate_outfeed" in pipeline_op_kwargs:
            raise ValueError("The `accumulate_outfeed` pipeline keyword argument"
                             " cannot be passed to the `IPUPipelineEstimatorSpec`.")
        return super().__new__(
            cls, mode, list(computational_stages), gradient_accumulation_count,
            eval_metrics_fn, optimizer_function, device_mapping, loss_accumulator_dtype,
            tuple(training_hooks or ()), tuple(evaluation_hooks or ()),
            tuple(prediction_hooks or ()), reduction_method, pipeline_op_kwargs)


class IPUPipelineEstimator(IPUEstimator):
    """Estimator for pipelining on IPUs (see the module doc)."""

    def __init__(self, model_fn, model_dir=None, config=None, params=None,
                 warm_start_from=None):
        super().__init__(model_fn, model_dir=model_dir, config=config, params=params,
                         warm_start_from=warm_start_from)

    def _loop_program(self, mode, dataset):
        return _PipelineProgram(self, mode, dataset)

    def call_pipeline_model_fn(self, mode):
        names = _arg_names(self._model_fn)
        if "features" in names or "labels" in names:
            raise ValueError(
                "The `model_fn` used with `IPUPipelineEstimator` must not have "
                "`features` or `labels` arguments. They are instead passed to the "
                "first pipeline stage function.")
        spec = self._model_fn(**self._context_kwargs(names, mode))
        if not isinstance(spec, IPUPipelineEstimatorSpec):
            raise TypeError("The `model_fn` used with `IPUPipelineEstimator` must return "
                            "`IPUPipelineEstimatorSpec`.")
        needed = len(set(spec.device_mapping)) if spec.device_mapping is not None \
            else len(spec.computational_stages)
        shards = self._config.ipu_run_config.num_shards
        if needed not in range(int(shards / 2) + 1, shards + 1):
            raise ValueError(
                f"This pipeline requires {needed} devices, but `IPURunConfig.num_shards` "
                f"was set to {shards} (num_shards/2 < pipeline_devices <= num_shards).")
        ipl = self._config.ipu_run_config.iterations_per_loop
        gac = spec.gradient_accumulation_count
        if ipl < gac:
            raise ValueError(
                f"`IPURunConfig.iterations_per_loop` (got {ipl}) cannot be less than "
                f"`gradient_accumulation_count` (got {gac})")
        if ipl % gac:
            raise ValueError(
                f"`IPURunConfig.iterations_per_loop` (got {ipl}) must be divisible by "
                f"`gradient_accumulation_count` (got {gac})")
        return spec


    def serving_outputs(self, features):
        """(predictions, None): the stages one after the other on `features`
        (the first stage's arguments, as the infeed gives them), the last
        stage's one output the predictions, as predict() outfeeds them."""
        from keras_ipu.loops import _body_arguments
        from keras_ipu.ops.functional_pipeline import run_stages

        spec = self.call_pipeline_model_fn(ModeKeys.PREDICT)
        args, kwargs = _body_arguments(features)
        _, _, outputs = run_stages(spec.computational_stages, args, kwargs)
        return _one_prediction(outputs), None


    def supervised_outputs(self, features, labels, mode):
        """Inside a trace, a TRAIN or EVAL export's step on one batch (one
        micro-batch): the stages one after the other on (features, labels)
        as the infeed gives them; TRAIN: the optimizer_function's optimizer
        applies that micro-batch's gradients (a pipeline of
        gradient_accumulation_count 1: train() applies G micro-batches'
        accumulated gradients, the same update when the G are this batch
        and the reduction is MEAN); EVAL: eval_metrics_fn on the last
        stage's outputs, compiled with them (evaluate() runs it on the
        host)."""
        import tensorflow as tf

        from keras_ipu.estimators.estimator import _updated_metrics
        from keras_ipu.loops import _body_arguments
        from keras_ipu.ops.functional_pipeline import OptimizerFunctionOutput
        from keras_ipu.ops.functional_pipeline import run_stages

        self.global_step_variable()
        spec = self.call_pipeline_model_fn(mode)
        args, kwargs = _body_arguments((features, labels))
        last_args, last_kwargs, _ = run_stages(spec.computational_stages, args, kwargs)
        if mode == ModeKeys.TRAIN:
            out = spec.optimizer_function(*last_args, **last_kwargs)
            if not isinstance(out, OptimizerFunctionOutput):
                raise TypeError("The optimizer_function must return a pipelining_ops."
                                f"OptimizerFunctionOutput, got {type(out).__name__}.")
            grads = out.opt.compute_gradients(out.loss, *out.compute_gradients_args,
                                              **out.compute_gradients_kwargs)
            train_op = out.opt.apply_gradients(grads, *out.apply_gradients_args,
                                               **out.apply_gradients_kwargs)
            with tf.control_dependencies([train_op]):
                return {"loss": tf.identity(out.loss), "metrics": {}}
        metrics = _checked_metrics(spec.eval_metrics_fn(*last_args, **last_kwargs))
        loss = metrics.pop("loss")
        return {"loss": loss, "metrics": _updated_metrics(metrics)}


def _checked_metrics(metrics):
    """A copy of eval_metrics_fn's dict, checked as Graphcore checks it."""
    if not isinstance(metrics, dict):
        raise TypeError(f"The `eval_metrics_fn` must return a dict, but got {type(metrics)}.")
    if "loss" not in metrics:
        raise KeyError("The dict returned from `eval_metrics_fn` must contain 'loss'.")
    return dict(metrics)


def _one_prediction(out):
    if isinstance(out, (list, tuple)):
        if len(out) != 1:
            raise ValueError(
                "The last computational stage must return exactly one prediction "
                f"tensor, but got {len(out)}")
        return out[0]
    return out


class _PipelineProgram(_LoopProgram):
    def _loop(self):
        from keras_ipu.ops.functional_pipeline import pipeline

        estimator = self.estimator
        mode = self.mode
        store = estimator._store  # noqa: SLF001 - the estimator's own store
        ipl = estimator.config.ipu_run_config.iterations_per_loop

        def loop():
            with store.trace():
                estimator.global_step_variable()
                spec = estimator.call_pipeline_model_fn(mode)
                self.spec = spec
                self.spec_hooks = {ModeKeys.TRAIN: spec.training_hooks,
                                   ModeKeys.EVAL: spec.evaluation_hooks,
                                   ModeKeys.PREDICT: spec.prediction_hooks}[mode]
                kwargs = dict(spec.pipeline_op_kwargs)
                if mode == ModeKeys.TRAIN:
                    kwargs.update(optimizer_function=spec.optimizer_function,
                                  outfeed_loss=True, reduction_method=spec.reduction_method,
                                  gradient_accumulation_dtype=kwargs.get(
                                      "gradient_accumulation_dtype"))
                pipeline(spec.computational_stages,
                         gradient_accumulation_count=spec.gradient_accumulation_count,
                         repeat_count=ipl // spec.gradient_accumulation_count,
                         infeed_queue=self.infeed, outfeed_queue=self.outfeed,
                         device_mapping=spec.device_mapping, **kwargs)

        loop.__name__ = f"ipu_pipeline_estimator_{mode}"
        self._host_metrics = None
        return loop

    def results(self):
        import tensorflow as tf

        out = self.outfeed.dequeue()
        if self.mode == ModeKeys.TRAIN:
            return {"loss": _replica_mean(out.numpy(), self.replicas)}
        if self.mode == ModeKeys.PREDICT:
            return {"predictions": _replica_batches(_one_prediction(out), self.replicas)}
        # The metrics see every replica's micro-batches, as one stream.
        return self._evaluate_on_host(_replica_batches(out, self.replicas))

    def _evaluate_on_host(self, out):
        """eval_metrics_fn over this loop's outputs, on the host: its metric
        variables (local, kept in the estimator's store) accumulate over the
        evaluation; returns the loss per step and each metric's value."""
        import tensorflow as tf

        from keras_ipu.loops import _body_arguments

        if self._host_metrics is None:
            store = self.estimator._store  # noqa: SLF001
            metrics_fn = self.spec.eval_metrics_fn

            def host(*args, **kwargs):
                with store.trace():
                    metrics = _checked_metrics(metrics_fn(*args, **kwargs))
                values = {}
                for key, metric in metrics.items():
                    if key == "loss":
                        continue
                    value, update = metric
                    if isinstance(update, tf.Operation):
                        with tf.control_dependencies([update]):
                            update = tf.identity(value)
                    values[key] = update
                return tf.reshape(tf.cast(metrics["loss"], tf.float32), [-1]), values

            self._host_metrics = tf.function(host, autograph=False)
        args, kwargs = _body_arguments(out)
        loss, values = self._host_metrics(*args, **kwargs)
        return {"loss": loss.numpy(), "metrics": {k: np.reshape(v.numpy(), [1])
                                                 for k, v in values.items()}}
