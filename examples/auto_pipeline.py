"""Automatic pipeline split (beyond Graphcore's API): given a model and a
number of IPUs, keras_ipu.models.auto_pipeline chooses the stage boundaries
whose training fit's program is predicted to run fastest while every IPU's
memory holds its stages, and says why; python -m keras_ipu.plan does the
same for a saved model.

    KERAS_BACKEND=ipu python examples/auto_pipeline.py

The model here does not fit one IPU at a micro-batch of 8192 (printed); on
four IPUs most splits overflow an IPU (Grouped stashes 7 micro-batches of
the first stage's activations), and the plan is the fastest split that
fits. The plan is then
applied and the model trains for two epochs of one weight update (8
micro-batches of 4).
"""

import os

os.environ.setdefault("KERAS_BACKEND", "ipu")

import keras  # noqa: E402

import keras_ipu as ipu  # noqa: E402
from synthetic_mnist import load  # noqa: E402


def main():
    (x, y), _ = load(n_train=32)
    config = ipu.config.IPUConfig()
    config.auto_select_ipus = 4
    config.configure_ipu_system()
    strategy = ipu.ipu_strategy.IPUStrategy()
    with strategy.scope():
        model = keras.Sequential(
            [keras.Input((28, 28, 1)), keras.layers.Flatten()]
            + [keras.layers.Dense(2048, activation="relu") for _ in range(6)]
            + [keras.layers.Dense(10)]
        )
        model.compile(keras.optimizers.SGD(0.05),
                      keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        # Planning traces the training step, it never runs it: a micro-batch
        # of 8192 costs no host memory.
        ipu.models.auto_pipeline(model, 1, 8192, gradient_accumulation=8)
        plan = ipu.models.auto_pipeline(model, 4, 8192, gradient_accumulation=8)
        plan.apply(model)
        model.set_pipelining_options(gradient_accumulation_steps_per_replica=8,
                                     gradient_accumulation_reduction_method="mean")
        model.compile(model.optimizer, model.loss, steps_per_execution=8)
        history = model.fit(x, y, batch_size=4, epochs=2, verbose=0)
        print(f"trained the planned pipeline: loss {history.history['loss'][0]:.3f} -> "
              f"{history.history['loss'][-1]:.3f}")


if __name__ == "__main__":
    main()
