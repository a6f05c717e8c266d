"""What a model function returns (Graphcore's IPUEstimatorSpec) and the
estimator's modes (tf.estimator.ModeKeys, gone from TensorFlow 2.16)."""

import collections


class ModeKeys:
    TRAIN = "train"
    EVAL = "eval"
    PREDICT = "infer"


_FIELDS = ("mode", "predictions", "loss", "train_op", "eval_metric_ops", "eval_metrics",
           "host_call", "training_hooks", "evaluation_hooks", "prediction_hooks")


class IPUEstimatorSpec(collections.namedtuple("IPUEstimatorSpec", _FIELDS)):
    """Ops and objects returned from a model_fn and passed to IPUEstimator:
    `loss` and `train_op` for TRAIN, `loss` and `eval_metric_ops` ({name:
    (value, update_op)} pairs of `tf.compat.v1.metrics`) for EVAL,
    `predictions` for PREDICT, and the hooks of each mode."""

    def __new__(cls, mode, predictions=None, loss=None, train_op=None, eval_metric_ops=None,
                eval_metrics=None, host_call=None, training_hooks=None, evaluation_hooks=None,
                prediction_hooks=None):
        if mode not in (ModeKeys.TRAIN, ModeKeys.EVAL, ModeKeys.PREDICT):
            raise ValueError(f"mode must be one of {ModeKeys.TRAIN!r}, {ModeKeys.EVAL!r}, "
                             f"{ModeKeys.PREDICT!r}; got {mode!r}.")
        if eval_metric_ops is not None and eval_metrics is not None:
            raise ValueError("eval_metrics and eval_metric_ops cannot both be set")
        if mode == ModeKeys.TRAIN and (loss is None or train_op is None):
            raise ValueError("Must provide loss and train_op for mode TRAIN.")
        if mode == ModeKeys.EVAL and loss is None:
            raise ValueError("Must provide loss for mode EVAL.")
        if mode == ModeKeys.PREDICT and predictions is None:
            raise ValueError("Must provide predictions for mode PREDICT.")
        return super().__new__(
            cls, mode, predictions, loss, train_op, eval_metric_ops, eval_metrics, host_call,
            tuple(training_hooks or ()), tuple(evaluation_hooks or ()),
            tuple(prediction_hooks or ()))


class EstimatorSpec(IPUEstimatorSpec):
    """tf.estimator.EstimatorSpec as the IPUEstimator runs it: an
    IPUEstimatorSpec that also keeps `export_outputs` ({signature key:
    tf.estimator.export.ExportOutput}), which shape the SignatureDefs of a
    SavedModel export (saved_model_export.py)."""

    def __new__(cls, mode, export_outputs=None, **fields):
        spec = super().__new__(cls, mode, **fields)
        spec.export_outputs = export_outputs
        return spec
