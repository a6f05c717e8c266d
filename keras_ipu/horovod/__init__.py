"""keras_ipu.horovod: the deprecated `tensorflow.python.ipu.horovod` path.

The same Horovod-style API as keras_ipu.distributed, and its
`popdist_strategy` and `ipu_horovod_strategy` modules.
"""

from keras_ipu.distributed import *  # noqa: F401,F403
from keras_ipu.distributed import __getattr__  # noqa: F401  (the lazy submodules)
from keras_ipu.distributed import init, shutdown  # noqa: F401
