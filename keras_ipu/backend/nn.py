"""Keras backend `nn` ops for the ipu backend (built from device primitives).

The ops live in keras_ipu/backend/nn_ops/, one module per kind; Keras
looks them up here.
"""

from keras_ipu.backend.nn_ops.activations import *  # noqa: F401,F403
from keras_ipu.backend.nn_ops.attention import *  # noqa: F401,F403
from keras_ipu.backend.nn_ops.convolution import *  # noqa: F401,F403
from keras_ipu.backend.nn_ops.ctc import *  # noqa: F401,F403
from keras_ipu.backend.nn_ops.losses import *  # noqa: F401,F403
from keras_ipu.backend.nn_ops.normalization import *  # noqa: F401,F403
from keras_ipu.backend.nn_ops.patches import *  # noqa: F401,F403
from keras_ipu.backend.nn_ops.pooling import *  # noqa: F401,F403
