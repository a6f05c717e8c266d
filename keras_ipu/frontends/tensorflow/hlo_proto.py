"""XLA HLO as TensorFlow hands it over: the module proto of a function, its
element types, shapes and literals as NumPy.

TensorFlow's own tf2xla bridge lowers a `tf.function(jit_compile=True)` to
an HLO module (`experimental_get_compiler_ir(...)(stage="hlo_serialized")`,
the program before XLA's optimisation passes); the protos that describe it
ship inside the TensorFlow wheel. Nothing here imports TensorFlow at module
import time: the proto modules load on first use.
"""

import functools

import numpy as np


@functools.lru_cache(maxsize=None)
def protos():
    """(hlo_pb2, xla_data_pb2) from the installed TensorFlow wheel."""
    from tensorflow.compiler.xla import xla_data_pb2
    from tensorflow.compiler.xla.service import hlo_pb2

    return hlo_pb2, xla_data_pb2


def parse_module(serialized):
    """An HloModuleProto from the bytes of stage="hlo_serialized"."""
    hlo_pb2, _ = protos()
    return hlo_pb2.HloModuleProto.FromString(serialized)


def _bfloat16():
    import ml_dtypes

    return np.dtype(ml_dtypes.bfloat16)


# XLA element type name -> NumPy dtype (bfloat16 from ml_dtypes, loaded when
# first needed). TUPLE and TOKEN are not arrays.
_DTYPES = {
    "PRED": np.dtype(bool),
    "S8": np.dtype(np.int8), "S16": np.dtype(np.int16),
    "S32": np.dtype(np.int32), "S64": np.dtype(np.int64),
    "U8": np.dtype(np.uint8), "U16": np.dtype(np.uint16),
    "U32": np.dtype(np.uint32), "U64": np.dtype(np.uint64),
    "F16": np.dtype(np.float16), "F32": np.dtype(np.float32),
    "F64": np.dtype(np.float64),
    "C64": np.dtype(np.complex64), "C128": np.dtype(np.complex128),
}


class UnsupportedTypeError(NotImplementedError):
    pass


def type_name(element_type):
    _, xla_data_pb2 = protos()
    return xla_data_pb2.PrimitiveType.Name(element_type)


def dtype_of(element_type):
    """The NumPy dtype of an XLA PrimitiveType number."""
    name = type_name(element_type)
    if name == "BF16":
        return _bfloat16()
    try:
        return _DTYPES[name]
    except KeyError:
        raise UnsupportedTypeError(
            f"XLA element type {name} has no counterpart on the simulated IPU "
            f"(supported: {', '.join(sorted(_DTYPES))}, BF16). Cast the "
            "TensorFlow value to one of those before the compiled function "
            "uses it."
        ) from None


def is_tuple(shape):
    return type_name(shape.element_type) == "TUPLE"


def is_token(shape):
    return type_name(shape.element_type) == "TOKEN"


def array_shape(shape):
    """(dims, dtype) of an array shape proto."""
    return tuple(int(d) for d in shape.dimensions), dtype_of(shape.element_type)


# LiteralProto field per element type: repeated numbers, or packed bytes.
_REPEATED = {"PRED": "preds", "S32": "s32s", "S64": "s64s", "U32": "u32s",
             "U64": "u64s", "F32": "f32s", "F64": "f64s"}
_PACKED = {"S8": "s8s", "U8": "u8s", "S16": "s16s", "U16": "u16s",
           "F16": "f16s", "BF16": "bf16s"}
_COMPLEX = {"C64": "c64s", "C128": "c128s"}


def literal_value(literal):
    """The NumPy value of a LiteralProto (a tuple literal gives a tuple).

    The proto stores elements in the order of the literal's layout
    (minor_to_major); the value returned is in logical (row-major) order.
    """
    shape = literal.shape
    if is_tuple(shape):
        return tuple(literal_value(t) for t in literal.tuple_literals)
    if is_token(shape):
        return None
    dims, dtype = array_shape(shape)
    name = type_name(shape.element_type)
    count = int(np.prod(dims, dtype=np.int64))
    if name in _REPEATED:
        flat = np.asarray(getattr(literal, _REPEATED[name]), dtype=dtype)
    elif name in _PACKED:
        # Packed little-endian, as the proto documents.
        flat = np.frombuffer(getattr(literal, _PACKED[name]),
                             dtype=dtype.newbyteorder("<")).astype(dtype)
    elif name in _COMPLEX:
        parts = np.asarray(getattr(literal, _COMPLEX[name]),
                           dtype=np.float32 if name == "C64" else np.float64)
        flat = (parts[0::2] + 1j * parts[1::2]).astype(dtype)
    else:
        raise UnsupportedTypeError(f"XLA literal of element type {name} cannot be read.")
    if flat.size != count:
        raise ValueError(
            f"XLA literal of shape {dims} ({name}) holds {flat.size} values, "
            f"expected {count}."
        )
    order = list(shape.layout.minor_to_major)
    if len(dims) > 1 and order and order != list(range(len(dims) - 1, -1, -1)):
        major_to_minor = order[::-1]
        physical = flat.reshape([dims[d] for d in major_to_minor])
        return np.transpose(physical, np.argsort(major_to_minor)).copy()
    return flat.reshape(dims)
