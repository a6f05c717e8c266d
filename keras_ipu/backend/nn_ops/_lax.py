"""The nn ops' builders: the shared lax-like wrappers of
keras_ipu.backend.prims, plus the dtype entry points of the nn ops.

The nn ops bind primitives directly (not via keras_ipu.backend.numpy) for
the common elementwise and reduction steps: operands here already share
one dtype, so no Keras promotion is needed, and scalar constants are made
in the operand's dtype so they never widen it.
"""

from keras_ipu.backend.prims import *  # noqa: F401,F403
from keras_ipu.backend.prims import cast
from keras_ipu.backend.prims import is_float
from keras_ipu.backend.prims import tensor

_FLOATS = ("float16", "bfloat16", "float32", "float64", "complex64", "complex128")
_WIDE = {"float32": "float64", "complex64": "complex128", "int32": "int64",
         "uint32": "uint64"}


def float_tensor(x):
    """x as a tensor; integer and bool inputs become floatx (as JAX's
    activations do)."""
    from keras.src.backend import config

    x = tensor(x)
    if not is_float(x):
        x = cast(x, config.floatx())
    return x


def promote(*xs, floating=False):
    """xs converted to their Keras result dtype (floatx for integer results
    when `floating`). Keras' lattice narrows 64-bit results to 32 bits (JAX
    without x64); the host keeps 64-bit inputs 64-bit, so an explicitly
    64-bit operand widens the result back."""
    from keras.src.backend.common import dtypes

    from keras_ipu.backend.dtype_utils import dtype_of

    kinds = [dtype_of(x) for x in xs]
    dtype = dtypes.result_type(*kinds)
    if floating and dtype not in _FLOATS:
        dtype = dtypes.result_type(dtype, float)
    if any(isinstance(k, str) and k.endswith("64") for k in kinds):
        dtype = _WIDE.get(dtype, dtype)
    return [tensor(x, dtype) for x in xs]
