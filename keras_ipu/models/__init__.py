"""The IPU side of Keras models: the extensions a model made in an
IPUStrategy scope gets (extension.py), its training on replicas and
pipelines (training_step, execution, functions, data, staged_graph), the
SDK 2.1 classes (sdk21), what the simulator predicts for its training
(prediction) and the automatic pipeline split (pipeline_planner).

    keras_ipu.models.auto_pipeline(model, num_ipus, batch_size)
    keras_ipu.models.predict_training(model, batch_size)
"""


def auto_pipeline(model, num_ipus, batch_size, **kwargs):
    from keras_ipu.models.pipeline_planner import auto_pipeline as plan

    return plan(model, num_ipus, batch_size, **kwargs)


auto_pipeline.__doc__ = """Choose pipeline stage boundaries for `model` over
`num_ipus` IPUs: the split fit's program is predicted to run fastest while
every IPU fits (keras_ipu/models/pipeline_planner.py). Returns a
PipelinePlan (printed)."""


def predict_training(model, batch_size, **kwargs):
    from keras_ipu.models.prediction import predict_training as predict

    return predict(model, batch_size, **kwargs)


predict_training.__doc__ = """What the simulator predicts for training
`model` with micro-batches of `batch_size` (keras_ipu/models/prediction.py)."""
