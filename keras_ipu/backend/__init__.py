"""The Keras backend "ipu".

Keras imports this package as its backend when KERAS_BACKEND=ipu (see
keras_ipu/_hook.py). Every op here is built from the device primitives in
keras_ipu.device.primitives.
"""

import sys as _sys

if "keras.src.backend" not in _sys.modules:
    # Imported before Keras: our own imports of keras.src.* would make Keras
    # import its backend, i.e. this half-initialised package, through the
    # hook. Step aside and let Keras import it whole; importlib then hands
    # the importer that complete module from sys.modules.
    del _sys.modules[__name__]
    import keras  # noqa: F401,E402

    if __name__ not in _sys.modules:  # another backend is selected
        import importlib as _importlib

        _importlib.import_module(__name__)
else:
    from keras.src.backend.common.name_scope import name_scope  # noqa: F401

    from keras_ipu.backend import core
    from keras_ipu.backend import operators as _operators
    from keras_ipu.backend import image  # noqa: F401
    from keras_ipu.backend import linalg  # noqa: F401
    from keras_ipu.backend import math  # noqa: F401
    from keras_ipu.backend import nn  # noqa: F401
    from keras_ipu.backend import numpy  # noqa: F401
    from keras_ipu.backend import random  # noqa: F401
    from keras_ipu.backend import tensorboard  # noqa: F401
    from keras_ipu.backend.core import IS_THREAD_SAFE  # noqa: F401
    from keras_ipu.backend.core import SUPPORTS_COMPLEX_DTYPES  # noqa: F401
    from keras_ipu.backend.core import SUPPORTS_RAGGED_TENSORS  # noqa: F401
    from keras_ipu.backend.core import SUPPORTS_SPARSE_TENSORS  # noqa: F401
    from keras_ipu.backend.core import Variable  # noqa: F401
    from keras_ipu.backend.core import cast  # noqa: F401
    from keras_ipu.backend.core import compute_output_spec  # noqa: F401
    from keras_ipu.backend.core import cond  # noqa: F401
    from keras_ipu.backend.core import convert_to_numpy  # noqa: F401
    from keras_ipu.backend.core import convert_to_tensor  # noqa: F401
    from keras_ipu.backend.core import device_scope  # noqa: F401
    from keras_ipu.backend.core import is_tensor  # noqa: F401
    from keras_ipu.backend.core import name_scope  # noqa: F401,F811
    from keras_ipu.backend.core import random_seed_dtype  # noqa: F401
    from keras_ipu.backend.core import scatter  # noqa: F401
    from keras_ipu.backend.core import shape  # noqa: F401
    from keras_ipu.backend.core import stop_gradient  # noqa: F401
    from keras_ipu.backend.core import vectorized_map  # noqa: F401
    from keras_ipu.backend.rnn import bidirectional_gru  # noqa: F401
    from keras_ipu.backend.rnn import bidirectional_lstm  # noqa: F401
    from keras_ipu.backend.rnn import cudnn_ok  # noqa: F401
    from keras_ipu.backend.rnn import gru  # noqa: F401
    from keras_ipu.backend.rnn import lstm  # noqa: F401
    from keras_ipu.backend.rnn import rnn  # noqa: F401

    from keras_ipu.backend import distribution_lib  # noqa: F401
    from keras_ipu.device.compiler import tensorflow_runtime as _tensorflow_runtime

    _operators.install()
    # TensorFlow is our engine's, not the user's: Keras' set_random_seed
    # imports it when installed, before our background XLA compile would.
    _tensorflow_runtime.quiet_tensorflow_start()
