"""Python operators and array methods for Tensor and Tracer.

Both types get the same methods, built from the backend ops, so Keras code
(and user code) behaves the same eagerly and while traced.
"""

from keras_ipu.device.array import Tensor
from keras_ipu.device.trace import Tracer


def _binary(op_name, reflected=False):
    def method(self, other):
        from keras_ipu.backend import numpy as knp

        if isinstance(other, (list, tuple, dict, set)) or other is None:
            return NotImplemented
        fn = getattr(knp, op_name)
        return fn(other, self) if reflected else fn(self, other)

    method.__name__ = op_name
    return method


def _logical_or_bitwise(logical, bitwise, reflected=False):
    def method(self, other):
        from keras_ipu.backend import numpy as knp

        if other is None:
            return NotImplemented
        a, b = (other, self) if reflected else (self, other)
        both_bool = getattr(a, "dtype", type(a)) in (bool,) or (
            str(getattr(a, "dtype", "")) == "bool"
        )
        both_bool = both_bool and str(getattr(b, "dtype", type(b).__name__)) == "bool"
        return getattr(knp, logical if both_bool else bitwise)(a, b)

    return method


def _unary(op_name):
    def method(self):
        from keras_ipu.backend import numpy as knp

        return getattr(knp, op_name)(self)

    return method


def _invert(self):
    from keras_ipu.backend import numpy as knp

    if self.dtype == bool:
        return knp.logical_not(self)
    return knp.bitwise_invert(self)


def _getitem(self, key):
    from keras_ipu.backend.indexing import getitem

    return getitem(self, key)


def _setitem(self, key, value):
    raise TypeError(
        "ipu tensors are immutable, as on the TensorFlow and JAX backends. "
        "Use `keras.ops.slice_update` or `keras.ops.scatter_update` to build "
        "an updated copy."
    )


def _astype(self, dtype):
    from keras_ipu.backend.core import cast

    return cast(self, dtype)


def _reshape(self, *shape):
    from keras_ipu.backend import numpy as knp

    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = shape[0]
    return knp.reshape(self, shape)


def _transpose_method(self, *axes):
    from keras_ipu.backend import numpy as knp

    if len(axes) == 1 and isinstance(axes[0], (tuple, list)):
        axes = axes[0]
    return knp.transpose(self, axes or None)


def _T(self):
    from keras_ipu.backend import numpy as knp

    return knp.transpose(self)


def _reduction_method(name):
    def method(self, axis=None, keepdims=False):
        from keras_ipu.backend import numpy as knp

        return getattr(knp, name)(self, axis=axis, keepdims=keepdims)

    return method


_BINARY = {
    "__add__": "add",
    "__sub__": "subtract",
    "__mul__": "multiply",
    "__truediv__": "true_divide",
    "__floordiv__": "floor_divide",
    "__mod__": "mod",
    "__pow__": "power",
    "__matmul__": "matmul",
    "__lshift__": "left_shift",
    "__rshift__": "right_shift",
}
_COMPARE = {
    "__eq__": "equal",
    "__ne__": "not_equal",
    "__lt__": "less",
    "__le__": "less_equal",
    "__gt__": "greater",
    "__ge__": "greater_equal",
}


def install():
    for cls in (Tensor, Tracer):
        for dunder, name in _BINARY.items():
            setattr(cls, dunder, _binary(name))
            setattr(cls, "__r" + dunder[2:], _binary(name, reflected=True))
        for dunder, name in _COMPARE.items():
            setattr(cls, dunder, _binary(name))
        cls.__and__ = _logical_or_bitwise("logical_and", "bitwise_and")
        cls.__rand__ = _logical_or_bitwise("logical_and", "bitwise_and", True)
        cls.__or__ = _logical_or_bitwise("logical_or", "bitwise_or")
        cls.__ror__ = _logical_or_bitwise("logical_or", "bitwise_or", True)
        cls.__xor__ = _logical_or_bitwise("logical_xor", "bitwise_xor")
        cls.__rxor__ = _logical_or_bitwise("logical_xor", "bitwise_xor", True)
        cls.__neg__ = _unary("negative")
        cls.__pos__ = lambda self: self
        cls.__abs__ = _unary("absolute")
        cls.__invert__ = _invert
        cls.__getitem__ = _getitem
        cls.__setitem__ = _setitem
        cls.__hash__ = None
        cls.astype = _astype
        cls.reshape = _reshape
        cls.transpose = _transpose_method
        cls.T = property(_T)
        for name in ("sum", "mean", "max", "min", "prod", "any", "all"):
            setattr(cls, name, _reduction_method(name))
