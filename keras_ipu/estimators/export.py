"""`tf.estimator.export` for the estimators' SavedModel export.

TensorFlow 2.16 removed tf.estimator, and with it the serving input
receivers an `export_saved_model` call is given. They are defined here as
TensorFlow 1 defined them (tensorflow_estimator's export/export.py): a
serving_input_receiver_fn takes no argument and, called inside the graph
the export builds, returns a ServingInputReceiver (features, a dict of
them, for the model_fn; the receiver tensors, the SavedModel's inputs) or
a TensorServingInputReceiver (one feature tensor handed to the model_fn as
it is). experimental_export_all_saved_models' TRAIN and EVAL graphs take
a SupervisedInputReceiver (features and labels, both receiver tensors),
made by build_raw_supervised_input_receiver_fn or
build_supervised_input_receiver_fn_from_input_fn. The export outputs (PredictOutput, ClassificationOutput,
RegressionOutput) are TensorFlow's own classes, which TensorFlow still
ships (tensorflow/python/saved_model/model_utils/export_output.py).

The shim of tf.estimator (tf_estimator.py) makes this module
`tf.estimator.export`. TensorFlow is imported when the functions run.
"""

import collections

_SINGLE_FEATURE_DEFAULT_NAME = "feature"
_SINGLE_RECEIVER_DEFAULT_NAME = "input"
_SINGLE_LABEL_DEFAULT_NAME = "label"
# The key a single tensor gets in each field (TensorFlow 1's names).
_SINGLE_TENSOR_DEFAULT_NAMES = {
    "feature": _SINGLE_FEATURE_DEFAULT_NAME,
    "receiver_tensor": _SINGLE_RECEIVER_DEFAULT_NAME,
    "receiver_tensors_alternative": _SINGLE_RECEIVER_DEFAULT_NAME,
}
_EXPORT_OUTPUTS = ("ExportOutput", "PredictOutput", "ClassificationOutput", "RegressionOutput")

__all__ = ["ServingInputReceiver", "TensorServingInputReceiver", "SupervisedInputReceiver",
           "build_raw_serving_input_receiver_fn", "build_parsing_serving_input_receiver_fn",
           "build_raw_supervised_input_receiver_fn",
           "build_supervised_input_receiver_fn_from_input_fn",
           *_EXPORT_OUTPUTS]


def _check_tensor(tensor, name, error_label="feature"):
    import tensorflow as tf

    if not isinstance(tensor, (tf.Tensor, tf.SparseTensor)):
        named = f" {name}" if name else ""
        raise ValueError(f"{error_label}{named} must be a Tensor or SparseTensor.")


def _wrap_and_check_input_tensors(tensors, field_name):
    """`tensors` as a dict of str to Tensor (a single tensor gets its
    field's default name), checked."""
    if tensors is None:
        raise ValueError(f"{field_name}s must be defined.")
    if not isinstance(tensors, dict):
        tensors = {_SINGLE_TENSOR_DEFAULT_NAMES[field_name]: tensors}
    for name, tensor in tensors.items():
        if not isinstance(name, str):
            raise ValueError(f"{field_name} keys must be strings: {name}.")
        _check_tensor(tensor, name, error_label=field_name)
    return tensors


class ServingInputReceiver(collections.namedtuple(
        "ServingInputReceiver", ["features", "receiver_tensors",
                                 "receiver_tensors_alternatives"])):
    """What a serving_input_receiver_fn returns: `features` (a Tensor,
    SparseTensor or dict of them; a single one is passed to the model_fn
    as {'feature': tensor}), `receiver_tensors` (the SavedModel's inputs:
    a tensor or dict of them, a single one named 'input') and
    `receiver_tensors_alternatives` (a dict of name to further groups of
    receiver tensors, each an extra signature)."""

    def __new__(cls, features, receiver_tensors, receiver_tensors_alternatives=None):
        features = _wrap_and_check_input_tensors(features, "feature")
        receiver_tensors = _wrap_and_check_input_tensors(receiver_tensors, "receiver_tensor")
        if receiver_tensors_alternatives is not None:
            if not isinstance(receiver_tensors_alternatives, dict):
                raise ValueError("receiver_tensors_alternatives must be a dict: "
                                 f"{receiver_tensors_alternatives}.")
            receiver_tensors_alternatives = {
                name: _wrap_and_check_input_tensors(group, "receiver_tensors_alternative")
                for name, group in receiver_tensors_alternatives.items()}
        return super().__new__(cls, features, receiver_tensors, receiver_tensors_alternatives)


class TensorServingInputReceiver(collections.namedtuple(
        "TensorServingInputReceiver", ["features", "receiver_tensors",
                                       "receiver_tensors_alternatives"])):
    """A ServingInputReceiver whose single feature tensor is passed to the
    model_fn as it is, not in a dict."""

    def __new__(cls, features, receiver_tensors, receiver_tensors_alternatives=None):
        if features is None:
            raise ValueError("features must be defined.")
        _check_tensor(features, None)
        receiver = ServingInputReceiver(features, receiver_tensors,
                                        receiver_tensors_alternatives)
        return super().__new__(cls, receiver.features[_SINGLE_FEATURE_DEFAULT_NAME],
                               receiver.receiver_tensors,
                               receiver.receiver_tensors_alternatives)


class SupervisedInputReceiver(collections.namedtuple(
        "SupervisedInputReceiver", ["features", "labels", "receiver_tensors"])):
    """What the input_receiver_fn of a TRAIN or EVAL export returns:
    `features` and `labels` (each a Tensor, SparseTensor or dict of them,
    handed to the model_fn as they are) and `receiver_tensors` (the
    SavedModel's inputs)."""

    def __new__(cls, features, labels, receiver_tensors):
        for values, label in ((features, "feature"), (labels, "label")):
            if isinstance(values, dict):
                _wrap_and_check_input_tensors(values, "feature")
            else:
                _check_tensor(values, None, error_label=label)
        receiver_tensors = _wrap_and_check_input_tensors(receiver_tensors, "receiver_tensor")
        return super().__new__(cls, features, labels, receiver_tensors)


def build_raw_supervised_input_receiver_fn(features, labels, default_batch_size=None):
    """An input_receiver_fn for TRAIN and EVAL exports whose receiver
    tensors are placeholders of `features` and `labels` (tensors or dicts of
    them, giving dtypes and shapes after the batch dimension): a single
    feature is received as 'input', a single label as 'label'."""
    feature_keys = features.keys() if isinstance(features, dict) else [_SINGLE_RECEIVER_DEFAULT_NAME]
    label_keys = labels.keys() if isinstance(labels, dict) else [_SINGLE_LABEL_DEFAULT_NAME]
    overlap = set(feature_keys) & set(label_keys)
    if overlap:
        raise ValueError("Features and labels must have distinct keys. Found overlapping "
                         f"keys: {overlap}")

    def placeholders(values):
        if isinstance(values, dict):
            return {name: _placeholder_from_tensor(t, default_batch_size)
                    for name, t in values.items()}
        return _placeholder_from_tensor(values, default_batch_size)

    def supervised_input_receiver_fn():
        feature_tensors, label_tensors = placeholders(features), placeholders(labels)
        receiver = {}
        for values, single in ((feature_tensors, _SINGLE_RECEIVER_DEFAULT_NAME),
                               (label_tensors, _SINGLE_LABEL_DEFAULT_NAME)):
            receiver.update(values if isinstance(values, dict) else {single: values})
        return SupervisedInputReceiver(feature_tensors, label_tensors, receiver)

    return supervised_input_receiver_fn


def build_supervised_input_receiver_fn_from_input_fn(input_fn, **input_fn_args):
    """build_raw_supervised_input_receiver_fn on the (features, labels) of
    the elements of the tf.data.Dataset `input_fn(**input_fn_args)`
    returns (their shapes after the batch dimension)."""
    import tensorflow as tf

    with tf.Graph().as_default():
        dataset = input_fn(**input_fn_args)
        if not isinstance(dataset, tf.data.Dataset):
            raise ValueError(
                f"input_fn must return a tf.data.Dataset, got {type(dataset).__name__}.")
        element = tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()
    if not isinstance(element, tuple) or len(element) != 2:
        raise ValueError("input_fn's dataset must give (features, labels) elements for a "
                         "supervised input receiver.")
    return build_raw_supervised_input_receiver_fn(*element)


def build_parsing_serving_input_receiver_fn(feature_spec, default_batch_size=None):
    """A serving_input_receiver_fn taking serialized tf.Example protos (a
    string placeholder of [default_batch_size], receiver tensor 'examples')
    and parsing them by `feature_spec` (a dict of str to
    tf.io.FixedLenFeature / VarLenFeature) into the features."""

    def serving_input_receiver_fn():
        import tensorflow as tf

        serialized = tf.compat.v1.placeholder(tf.string, shape=[default_batch_size],
                                              name="input_example_tensor")
        features = tf.io.parse_example(serialized, feature_spec)
        return ServingInputReceiver(features, {"examples": serialized})

    return serving_input_receiver_fn


def _placeholder_from_tensor(t, default_batch_size):
    """A placeholder of `t`'s dtype and shape, its batch size (first
    dimension) `default_batch_size`, named after `t`'s op where it has one."""
    import tensorflow as tf

    shape = tf.TensorShape([default_batch_size]).concatenate(t.shape[1:])
    try:
        name = t.op.name
    except AttributeError:  # an eager tensor has no op
        name = None
    return tf.compat.v1.placeholder(dtype=t.dtype, shape=shape, name=name)


def build_raw_serving_input_receiver_fn(features, default_batch_size=None):
    """A serving_input_receiver_fn whose receiver tensors are the features
    themselves: one placeholder per entry of `features` (a dict of str to
    Tensor, giving dtypes and shapes after the batch dimension)."""

    def serving_input_receiver_fn():
        receiver_tensors = {name: _placeholder_from_tensor(t, default_batch_size)
                            for name, t in features.items()}
        return ServingInputReceiver(receiver_tensors, receiver_tensors)

    return serving_input_receiver_fn


def __getattr__(name):
    if name in _EXPORT_OUTPUTS:
        from tensorflow.python.saved_model.model_utils import export_output

        return getattr(export_output, name)
    raise AttributeError(
        f"tf.estimator.export.{name}: keras_ipu provides "
        f"{', '.join(sorted(__all__))} for the estimators' export_saved_model.")
