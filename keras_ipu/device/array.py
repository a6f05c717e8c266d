"""The concrete array type of the ipu backend.

A Tensor wraps a NumPy array that nobody mutates: every primitive returns
new arrays, Variables replace their Tensor on assignment. NumPy arrays given
by the user are inputs, not Tensors (as on the TensorFlow and JAX backends).
The backend installs the Python operators (`+`, `[...]`, ...) on Tensor and
on the tracer's Tracer, so both behave the same in Keras code.
"""

import numpy as np

from keras_ipu.device.ir import ShapedArray
from keras_ipu.device.ir import forward_array_attributes


@forward_array_attributes("_value")
class Tensor:
    # __dict__ (allocated only when used) lets callers set attributes, as
    # Keras tests do to mock `numpy()` on a tensor.
    __slots__ = ("_value", "__weakref__", "__dict__")

    # numpy must defer to our operators (ndarray + Tensor -> Tensor).
    __array_priority__ = 100

    def __init__(self, value):
        self._value = value

    @property
    def aval(self):
        return ShapedArray(self._value.shape, self._value.dtype)

    @property
    def nbytes(self):
        return self._value.nbytes

    def numpy(self):
        return self._value

    def item(self, *args):
        return self._value.item(*args)

    def tolist(self):
        return self._value.tolist()

    def __array__(self, dtype=None, copy=None):
        if dtype is not None and np.dtype(dtype) != self._value.dtype:
            return self._value.astype(dtype)
        if copy:
            return self._value.copy()
        return self._value

    def __len__(self):
        if self._value.ndim == 0:
            raise TypeError("len() of unsized object (a 0-d Tensor)")
        return len(self._value)

    def __iter__(self):
        if self._value.ndim == 0:
            raise TypeError("iteration over a 0-d Tensor")
        return (self[i] for i in range(len(self._value)))

    def __bool__(self):
        return bool(self._value)

    def __int__(self):
        return int(self._value)

    def __float__(self):
        return float(self._value)

    def __complex__(self):
        return complex(self._value)

    def __index__(self):
        return self._value.__index__()

    def __repr__(self):
        body = np.array2string(self._value, separator=", ", prefix="Tensor(")
        return f"Tensor({body}, shape={self.shape}, dtype={self.dtype.name})"

    def __str__(self):
        # As NumPy and JAX print arrays: print(keras.ops.add(1, 2)) shows 3.
        return str(self._value)

    def __reduce__(self):
        return (Tensor, (self._value,))

    def __copy__(self):
        return self

    def __deepcopy__(self, memo):
        return Tensor(self._value.copy())

    def __format__(self, spec):
        if self._value.ndim == 0:
            return format(self._value.item(), spec)
        return format(str(self), spec)
