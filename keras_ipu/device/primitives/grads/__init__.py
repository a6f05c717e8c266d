"""The gradient rules of the primitives (contract: keras_ipu/device/autodiff),
one module per module of declarations: the second step of registering the
primitive set, after every primitive is declared (a rule binds primitives
of other modules: a sum's gradient broadcasts, a broadcast's sums). The
rules of control flow differentiate sub-graphs: the autodiff registers them
(autodiff/control_flow.py)."""

from keras_ipu.device.primitives.grads import conv  # noqa: F401
from keras_ipu.device.primitives.grads import convert  # noqa: F401
from keras_ipu.device.primitives.grads import cumulative  # noqa: F401
from keras_ipu.device.primitives.grads import dot  # noqa: F401
from keras_ipu.device.primitives.grads import elementwise  # noqa: F401
from keras_ipu.device.primitives.grads import fft  # noqa: F401
from keras_ipu.device.primitives.grads import indexing  # noqa: F401
from keras_ipu.device.primitives.grads import linalg  # noqa: F401
from keras_ipu.device.primitives.grads import pooling  # noqa: F401
from keras_ipu.device.primitives.grads import reduce  # noqa: F401
from keras_ipu.device.primitives.grads import sort  # noqa: F401
from keras_ipu.device.primitives.grads import special  # noqa: F401
from keras_ipu.device.primitives.grads import structure  # noqa: F401
