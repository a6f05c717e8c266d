"""Dropout as Graphcore's IPU layer: an optional seed *pair*, and its rules
for rate and noise_shape."""

import keras
import numpy as np
from keras.src import backend

from keras_ipu.layers._base import serializable


def _seed_key(seed):
    """The uint32[2] key of a two-element seed (Graphcore's int32 pair)."""
    shape = np.shape(seed)
    if shape != (2,):
        raise ValueError(
            f"Expected the seed to have a shape [2], but got {list(shape)}. "
            "Pass two 32-bit integers, e.g. seed=(1, 2), or no seed."
        )
    return (np.asarray(seed, np.int64) & 0xFFFFFFFF).astype(np.uint32)


@serializable
class Dropout(keras.layers.Layer):
    """Dropout layer optimized for running on the IPU.

    Randomly sets input units to 0 with a frequency of `rate` in training
    (`training=True`); kept units are scaled by 1 / (1 - rate).

    Args:
      rate: the fraction of units to drop, in [0, 1).
      noise_shape: the shape of the binary mask multiplied with the input
        (1 where the mask is broadcast, or the input's size).
      seed: an optional pair of 32-bit integers seeding the mask. As a seed
        given to the IPU's dropout, it is a constant of the program: every
        step draws the same mask. Without it, each step draws a new mask
        from the layer's seed state (as Keras' Dropout does).
    """

    def __init__(self, rate, noise_shape=None, seed=None, **kwargs):
        self.ref = kwargs.pop("ref", True)
        super().__init__(**kwargs)
        if not 0.0 <= rate < 1.0:
            raise ValueError(
                f"The rate must be in the range [0, 1), but was {rate}")
        self.rate = rate
        self.noise_shape = None if noise_shape is None else tuple(noise_shape)
        self.seed = None if seed is None else [int(s) for s in np.asarray(seed).ravel()]
        if seed is not None:
            self._key = _seed_key(seed)
        else:
            self._key = None
            self.seed_generator = backend.random.SeedGenerator()
        self.supports_masking = True

    def _check_noise_shape(self, shape):
        if not self.noise_shape:
            return
        if len(shape) != len(self.noise_shape):
            raise ValueError("The length of noise_shape must equal the rank of x.")
        for i, j in zip(shape, self.noise_shape):
            if j == 1 or i is None or j is None:
                continue
            if i != j:
                raise ValueError(f"Dimension mismatch, {i} != {j}.")

    def call(self, inputs, training=None):
        self._check_noise_shape(tuple(inputs.shape))
        if not training or self.rate == 0:
            return inputs
        seed = self._key if self._key is not None else self.seed_generator
        return backend.random.dropout(
            inputs, self.rate, noise_shape=self.noise_shape, seed=seed)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {
            **super().get_config(),
            "rate": self.rate,
            "noise_shape": self.noise_shape,
            "seed": self.seed,
            "ref": self.ref,
        }
