"""The primitive set of the simulated IPU (like jax.lax).

Importing this package registers every primitive in `registry.REGISTRY`,
in two steps: the declarations (shape rule, kernel, facts, cost rule; one
module per family), then their gradient rules (grads/), which bind
primitives of any family.
"""

from keras_ipu.device.primitives import candidate_sampling  # noqa: F401
from keras_ipu.device.primitives import collective  # noqa: F401
from keras_ipu.device.primitives import control_flow  # noqa: F401
from keras_ipu.device.primitives import conv  # noqa: F401
from keras_ipu.device.primitives import convert  # noqa: F401
from keras_ipu.device.primitives import ctc  # noqa: F401
from keras_ipu.device.primitives import cumulative  # noqa: F401
from keras_ipu.device.primitives import dot  # noqa: F401
from keras_ipu.device.primitives import dynamic  # noqa: F401
from keras_ipu.device.primitives import elementwise  # noqa: F401
from keras_ipu.device.primitives import fft  # noqa: F401
from keras_ipu.device.primitives import host_transfer  # noqa: F401
from keras_ipu.device.primitives import indexing  # noqa: F401
from keras_ipu.device.primitives import inter_ipu  # noqa: F401
from keras_ipu.device.primitives import linalg  # noqa: F401
from keras_ipu.device.primitives import markers  # noqa: F401
from keras_ipu.device.primitives import pooling  # noqa: F401
from keras_ipu.device.primitives import random_bits  # noqa: F401
from keras_ipu.device.primitives import reduce  # noqa: F401
from keras_ipu.device.primitives import sort  # noqa: F401
from keras_ipu.device.primitives import special  # noqa: F401
from keras_ipu.device.primitives import special_derivatives  # noqa: F401
from keras_ipu.device.primitives import structure  # noqa: F401
from keras_ipu.device.primitives import xla_random  # noqa: F401
from keras_ipu.device.primitives import grads  # noqa: F401 (second step: the rules)
from keras_ipu.device.primitives.registry import REGISTRY  # noqa: F401
from keras_ipu.device.primitives.registry import Primitive  # noqa: F401
