"""Graphcore's PopDist tutorial (tutorials/feature_examples/tensorflow2/popdist/
popdist_training.py), ported by the porting contract's import edits.

    python -m keras_ipu.poprun --num-instances 2 --num-replicas 4 \\
        python examples/popdist_training.py [--epochs 1] [--samples 512]

Every instance builds the same CNN in a PopDistStrategy scope, trains on
its shard of the data set (`dataset.shard(popdist.getNumInstances(),
popdist.getInstanceIndex())`) with its `popdist.getNumLocalReplicas()`
replicas, and the gradients are averaged over every replica of every
instance; instance 0 saves the model. The edits against Graphcore's file:

- `import popdist`, `import popdist.tensorflow` ->
  `from keras_ipu import popdist`, `import keras_ipu.popdist.tensorflow`;
- `from tensorflow.python import ipu` -> `import keras_ipu as ipu`, and
  `ipu.distributed.popdist_strategy` is at the same path;
- `tf.keras.X` -> `keras.X` (KERAS_BACKEND=ipu);
- CIFAR-10 (a download) -> synthetic images of the same shape, so that the
  example runs anywhere (`--samples` of them), and `--epochs`.
"""

import argparse
import os

os.environ.setdefault("KERAS_BACKEND", "ipu")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import keras_ipu as ipu  # noqa: E402
import keras_ipu.popdist.tensorflow  # noqa: E402
from keras_ipu import popdist  # noqa: E402
from keras_ipu.distributed import popdist_strategy  # noqa: E402

# Note that this is the per replica batch size. The batch size for each
# training step will be `BATCH_SIZE * popdist.getNumTotalReplicas()`.
BATCH_SIZE = 32
LEARNING_RATE = 0.01


def initialize_model():
    return keras.models.Sequential(
        [
            keras.Input((32, 32, 3)),
            keras.layers.Conv2D(32, 3, activation="relu"),
            keras.layers.Conv2D(32, 3, activation="relu"),
            keras.layers.MaxPool2D((2, 2)),
            keras.layers.Dropout(0.25),
            keras.layers.Conv2D(64, 3, activation="relu"),
            keras.layers.Conv2D(64, 3, activation="relu"),
            keras.layers.MaxPool2D((2, 2)),
            keras.layers.Dropout(0.25),
            keras.layers.Flatten(),
            keras.layers.Dense(512, activation="relu"),
            keras.layers.Dropout(0.5),
            keras.layers.Dense(10),
        ]
    )


def synthetic_cifar10(samples):
    """Images and labels shaped like CIFAR-10's; the label decides the mean
    colour, so that there is something to learn."""
    rng = np.random.default_rng(0)
    y = rng.integers(0, 10, size=(samples, 1)).astype(np.int32)
    x = rng.uniform(0, 255, size=(samples, 32, 32, 3)) * 0.5 + y[:, :, None, None] * 12.0
    return x.astype(np.uint8), y


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--samples", type=int, default=512)
    parser.add_argument("--save", default="saved_model.keras")
    args = parser.parse_args()

    # Initialize IPU configuration.
    config = ipu.config.IPUConfig()
    keras_ipu.popdist.tensorflow.set_ipu_config(config)
    config.configure_ipu_system()

    # Create distribution strategy.
    strategy = popdist_strategy.PopDistStrategy()

    # Get and normalize the training data.
    train_x, train_y = synthetic_cifar10(args.samples)
    train_x = train_x.astype(np.float32) / 255.0
    train_y = train_y.astype(np.int32)

    # Create dataset and shard it across the instances.
    dataset = tf.data.Dataset.from_tensor_slices((train_x, train_y))
    dataset = dataset.shard(num_shards=popdist.getNumInstances(), index=popdist.getInstanceIndex())

    # Perform shuffling and batching after sharding.
    dataset = dataset.shuffle(buffer_size=len(dataset))
    dataset = dataset.batch(batch_size=BATCH_SIZE, drop_remainder=True)

    # Calculate steps per execution.
    steps_per_execution = len(dataset) // popdist.getNumLocalReplicas()

    if popdist.getInstanceIndex() == 0:
        print(f"Number of samples:\t{len(train_y)}")
        print(f"Data distribution between {popdist.getNumInstances()} instances:")
        samples_per_shard = len(train_y) // popdist.getNumInstances()
        print(f"\tSamples per shard:\t{samples_per_shard}")
        print(f"\tBatches per shard:\t{samples_per_shard // BATCH_SIZE}")
        print(
            f"Data distribution within each instance "
            f"({popdist.getNumLocalReplicas()} local replica(s)):"
        )
        print(f"Steps per execution:\t{steps_per_execution}")

    with strategy.scope():
        model = initialize_model()
        optimizer = keras.optimizers.SGD(learning_rate=LEARNING_RATE)
        loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

        model.compile(
            optimizer=optimizer,
            loss=loss_fn,
            metrics=["accuracy"],
            steps_per_execution=steps_per_execution,
        )
        model.fit(dataset, epochs=args.epochs, verbose=2 if popdist.getInstanceIndex() == 0 else 0)

        if popdist.getInstanceIndex() == 0:
            model.save(args.save)
            print(f"saved {args.save}")


if __name__ == "__main__":
    main()
