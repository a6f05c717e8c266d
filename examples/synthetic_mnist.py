"""MNIST-sized synthetic data for the examples: 28x28x1 images of 10 classes,
each class a fixed random template plus noise (learnable in a few steps,
no download)."""

import numpy as np

NUM_CLASSES = 10
SHAPE = (28, 28, 1)


def load(n_train=2048, n_test=512, seed=0):
    rng = np.random.default_rng(seed)
    templates = rng.normal(size=(NUM_CLASSES,) + SHAPE).astype("float32")

    def sample(n):
        y = rng.integers(0, NUM_CLASSES, n).astype("int32")
        x = templates[y] + 0.8 * rng.normal(size=(n,) + SHAPE).astype("float32")
        return x.astype("float32"), y

    return sample(n_train), sample(n_test)
