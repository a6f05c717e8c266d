"""keras.ops.numpy functions that are matrix decompositions in disguise.

They are composed in keras_ipu.backend.linalg from the LU primitive.
"""

from keras_ipu.backend import linalg as _linalg

__all__ = ["slogdet"]


def slogdet(x):
    return _linalg.slogdet(x)
