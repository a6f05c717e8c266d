"""`ipu_tensorflow_addons.v1`: the TensorFlow 1 API of Graphcore's addons
(its `layers`)."""

from keras_ipu._lazy_modules import lazy_submodules as _lazy_submodules

__getattr__, __dir__ = _lazy_submodules(__name__, ("layers",))
