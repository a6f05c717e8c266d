"""`tf.estimator` for IPUEstimator model functions.

TensorFlow 2.16 removed `tf.estimator` (and the tensorflow_estimator
package with it). Graphcore's estimator scripts use two of its names inside
their model functions, `tf.estimator.ModeKeys` and `tf.estimator.EstimatorSpec`,
and hand the rest to ipu_estimator; their export code uses
`tf.estimator.export` (serving input receivers, export outputs:
estimators/export.py). The import hook makes this module
TensorFlow's `estimator` attribute when TensorFlow has none
(keras_ipu/_hook.py, MODULE_ATTRIBUTES), so those scripts run unedited. Any
other `tf.estimator` name fails with an AttributeError naming the edit.
"""

from keras_ipu.estimators import export
from keras_ipu.estimators.spec import EstimatorSpec as _Spec
from keras_ipu.estimators.spec import ModeKeys

__all__ = ["EstimatorSpec", "ModeKeys", "export"]


def EstimatorSpec(mode, predictions=None, loss=None, train_op=None, eval_metric_ops=None,  # noqa: N802
                  export_outputs=None, training_chief_hooks=None, training_hooks=None,
                  scaffold=None, evaluation_hooks=None, prediction_hooks=None):
    """tf.estimator.EstimatorSpec's arguments, as the IPUEstimatorSpec the
    IPUEstimator runs. One process is the chief: its chief hooks are
    training hooks. `export_outputs` shape the signatures of a SavedModel
    export (export_saved_model)."""
    if scaffold is not None:
        raise NotImplementedError(
            "tf.estimator.EstimatorSpec(scaffold=...) is not supported by keras_ipu's "
            "IPUEstimator: it builds its own session state; initialise variables in "
            "the model function and restore checkpoints through RunConfig's model_dir.")
    hooks = tuple(training_hooks or ()) + tuple(training_chief_hooks or ())
    return _Spec(mode, export_outputs=export_outputs, predictions=predictions, loss=loss,
                 train_op=train_op, eval_metric_ops=eval_metric_ops, training_hooks=hooks,
                 evaluation_hooks=evaluation_hooks, prediction_hooks=prediction_hooks)


def __getattr__(name):
    raise AttributeError(
        f"tf.estimator.{name}: TensorFlow 2.16 removed tf.estimator. keras_ipu "
        "provides tf.estimator.ModeKeys, tf.estimator.EstimatorSpec and "
        "tf.estimator.export for IPUEstimator model functions; for the estimator itself use "
        "ipu.ipu_estimator.IPUEstimator and ipu.ipu_run_config.RunConfig "
        "(from tensorflow.python import ipu).")
