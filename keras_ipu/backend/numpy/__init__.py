"""keras.ops.numpy for the ipu backend, split by kind of op.

Every submodule lists its ops in `__all__`; Keras looks them up here.
"""

from keras_ipu.backend.numpy.elementwise import *  # noqa: F401,F403
from keras_ipu.backend.numpy.arrays import *  # noqa: F401,F403
from keras_ipu.backend.numpy.reductions import *  # noqa: F401,F403
from keras_ipu.backend.numpy.linear import *  # noqa: F401,F403
from keras_ipu.backend.numpy.decompositions import *  # noqa: F401,F403
from keras_ipu.backend.numpy.functional import *  # noqa: F401,F403
