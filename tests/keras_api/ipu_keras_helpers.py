"""Models, data and checks shared by the tests of the Keras API."""

import keras
import numpy as np

import keras_ipu as ipu


def configure(num_ipus):
    cfg = ipu.config.IPUConfig()
    cfg.auto_select_ipus = num_ipus
    cfg.configure_ipu_system()


def regression_data(n=64, features=8, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, features)).astype("float32")
    w = rng.normal(size=(features, 1)).astype("float32")
    return x, (x @ w + 0.1 * rng.normal(size=(n, 1))).astype("float32")


def mlp(strategy, stages=None, batch_norm=False, seed=3):
    """Input(8) -> Dense(16, relu) [-> BatchNorm] -> Dense(1); with
    `stages`, each layer in the PipelineStage given."""
    keras.utils.set_random_seed(seed)
    stages = stages or [None, None, None]

    def stage(i):
        if stages[i] is None:
            return _NoStage()
        return ipu.keras.PipelineStage(stages[i])

    with strategy.scope():
        x = inputs = keras.Input((8,))
        with stage(0):
            x = keras.layers.Dense(16, activation="relu")(x)
        if batch_norm:
            with stage(1):
                x = keras.layers.BatchNormalization()(x)
        with stage(2):
            x = keras.layers.Dense(1)(x)
        return keras.Model(inputs, x)


def two_stage_pipeline(ipu_api=ipu, seed=3):
    """Input(16) -> Dense(32, tanh) in PipelineStage 0 -> Dense(8) in stage 1,
    made in an IPUStrategy scope and compiled (SGD 0.1, mse, 4 steps per
    execution, 4 micro-batches per optimizer step). Backend-neutral: the
    TensorFlow front end's scenario (keras_tf_scenarios.py) builds it under
    tf.keras with Graphcore's `tensorflow.python.ipu` as `ipu_api`, and its
    test compares the placement with the ipu backend's."""
    keras.utils.set_random_seed(seed)
    with ipu_api.ipu_strategy.IPUStrategy().scope():
        x = inputs = keras.Input((16,))
        with ipu_api.keras.PipelineStage(0):
            x = keras.layers.Dense(32, activation="tanh")(x)
        with ipu_api.keras.PipelineStage(1):
            x = keras.layers.Dense(8)(x)
        model = keras.Model(inputs, x)
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse", steps_per_execution=4)
        model.set_pipelining_options(gradient_accumulation_steps_per_replica=4)
    return model


class _NoStage:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def max_weight_difference(a, b):
    return max(float(np.max(np.abs(x - y))) for x, y in zip(a.get_weights(), b.get_weights()))
