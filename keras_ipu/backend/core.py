"""Core of the ipu backend: tensors, variables, conversion, output specs."""

import contextlib
import warnings

import numpy as np

from keras.src import tree
from keras.src.backend.common import KerasVariable
from keras.src.backend.common import global_state
from keras.src.backend.common import standardize_dtype
from keras.src.backend.common.dtypes import result_type
from keras.src.backend.common.keras_tensor import KerasTensor
from keras.src.backend.common.name_scope import name_scope as base_name_scope
from keras.src.backend.common.stateless_scope import get_stateless_scope
from keras.src.backend.common.stateless_scope import in_stateless_scope
from keras.src.backend.common.stateless_scope import StatelessScope
from keras.src.backend.common.symbolic_scope import SymbolicScope

from keras_ipu.device import primitives as _registered  # noqa: F401
from keras_ipu.device.array import Tensor
from keras_ipu.device.ir import ShapedArray
from keras_ipu.device.primitives.convert import convert_element_type_p
from keras_ipu.device.trace import GraphBuilder
from keras_ipu.device.trace import current_builder
from keras_ipu.device.trace import set_source_provider as _set_source_provider
from keras_ipu.device.trace import Tracer
from keras_ipu.device.trace import tracing

SUPPORTS_SPARSE_TENSORS = False
SUPPORTS_RAGGED_TENSORS = False
SUPPORTS_COMPLEX_DTYPES = True
IS_THREAD_SAFE = True

_TENSOR_TYPES = (Tensor, Tracer)


def _np_dtype(dtype):
    """A Keras dtype name as a NumPy dtype (bfloat16 via ml_dtypes)."""
    if dtype == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(dtype)


class Variable(KerasVariable):
    # True while the array the trainer stored here (a step's result) has
    # not been read by anyone: the next compiled step may then update it in
    # place (donation, model_state.read_owned_state). Any read of `value`
    # or assignment from elsewhere clears it.
    _ipu_private = False

    def _initialize(self, value):
        self._value = _owned_tensor(value, self._dtype)

    def _direct_assign(self, value):
        self._ipu_private = False
        self._value = _owned_tensor(value, self._dtype)

    @property
    def value(self):
        self._ipu_private = False  # whoever reads it may keep the array
        if self._value is None and current_builder() in _spec_builders:
            scope = in_stateless_scope() and get_stateless_scope()
            if not scope or scope.get_current_value(self) is None:
                # An uninitialized variable (StatelessScope(initialize_variables=
                # False)) read while tracing an output spec: Keras runs its
                # initializer for a placeholder, which here would draw every
                # weight on the host (BERT-large's 340M: 60% of
                # predict_training's time). Only shape and dtype matter, as
                # under jax.eval_shape.
                return self._maybe_autocast(current_builder().new_input(
                    ShapedArray(tuple(self._shape), _np_dtype(self._dtype))))
        return super().value

    def _convert_to_tensor(self, value, dtype=None):
        return convert_to_tensor(value, dtype=dtype)

    def __array__(self, dtype=None, copy=None):
        value = np.asarray(self.value)
        return value if dtype is None else value.astype(dtype)


def _owned_tensor(value, dtype):
    """A Tensor for a variable: never aliases an array the user may mutate."""
    if isinstance(value, Tracer):
        return value
    if isinstance(value, Tensor) and value.dtype == _np_dtype(dtype):
        return value
    return Tensor(np.array(np.asarray(value), dtype=_np_dtype(dtype)))


def convert_to_tensor(x, dtype=None, sparse=None, ragged=None):
    if sparse:
        raise ValueError(
            "`sparse=True` is not supported by the ipu backend: IPU programs "
            "use dense tensors. Densify the input first."
        )
    if ragged:
        raise ValueError(
            "`ragged=True` is not supported by the ipu backend: IPU programs "
            "have static shapes. Pad the input to a fixed length first."
        )
    if dtype is not None:
        dtype = standardize_dtype(dtype)
    if isinstance(x, Variable):
        x = x.value
    if isinstance(x, _TENSOR_TYPES):
        if dtype is None or x.dtype == _np_dtype(dtype):
            return x
        return convert_element_type_p.bind(x, dtype=_np_dtype(dtype))
    if isinstance(x, (list, tuple)) and any(
        isinstance(e, (Tracer, Variable)) for e in tree.flatten(x)
    ):
        from keras_ipu.backend import numpy as knp

        return knp.stack([convert_to_tensor(e, dtype) for e in x])
    if dtype is None:
        if isinstance(x, np.ndarray):
            dtype = standardize_dtype(x.dtype)
        else:
            dtype = result_type(
                *[getattr(item, "dtype", type(item)) for item in tree.flatten(x)]
            )
    if hasattr(x, "numpy") and not isinstance(x, np.ndarray):
        # TensorFlow/JAX arrays handed over from a data pipeline.
        x = x.numpy()
    np_dtype = _np_dtype(dtype)
    if np_dtype.name == "bfloat16" and not isinstance(x, np.ndarray):
        return Tensor(np.asarray(x).astype(np_dtype))
    return Tensor(np.array(x, dtype=np_dtype))


def convert_to_numpy(x):
    if isinstance(x, Tracer):
        raise x._concrete_error("convert_to_numpy()")
    if isinstance(x, Tensor):
        return np.array(x._value)
    if isinstance(x, Variable):
        return np.array(x.value)
    return np.array(x)


def is_tensor(x):
    return isinstance(x, _TENSOR_TYPES)


def shape(x):
    return tuple(x.shape)


def cast(x, dtype):
    return convert_to_tensor(x, dtype=dtype)


def compute_output_spec(fn, *args, **kwargs):
    """Shapes and dtypes of fn's outputs, found by tracing fn abstractly.

    Dimensions that are None stay None (each primitive's shape rule carries
    them); nothing is computed on dummy data. Python code that does
    arithmetic on an unknown dimension (`ops.shape(x)[0] * n`) cannot be
    traced that way; then fn is traced twice more with two stand-in sizes
    for the unknown dimensions (still abstract: shapes only), and an output
    dimension that differs between the two is unknown, as Keras' JAX
    backend does.
    """
    try:
        return _trace_output_spec(fn, args, kwargs, fill=None)
    except (TypeError, ValueError) as error:
        if not _has_unknown_dims((args, kwargs)):
            raise
        try:
            first = _trace_output_spec(fn, args, kwargs, fill=_STAND_IN_SIZES[0])
            second = _trace_output_spec(fn, args, kwargs, fill=_STAND_IN_SIZES[1])
        except Exception:
            raise error from None
    return tree.map_structure(_merge_specs, first, second)


# Two sizes no real dimension is likely to equal by chance, nor each other.
_STAND_IN_SIZES = (83, 89)


def _has_unknown_dims(structure):
    return any(
        isinstance(x, KerasTensor) and None in x.shape
        for x in tree.flatten(structure)
    )


def _merge_specs(a, b):
    if not isinstance(a, KerasTensor):
        return a
    shape = tuple(
        da if da == db else None for da, db in zip(a.shape, b.shape)
    )
    return KerasTensor(shape, a.dtype)


# The builders of the output-spec traces running now (Variable.value).
_spec_builders = set()


def _trace_output_spec(fn, args, kwargs, fill):
    with StatelessScope(), SymbolicScope():
        builder = GraphBuilder()

        def to_tracer(x):
            if isinstance(x, KerasTensor):
                shape = x.shape
                if fill is not None:
                    shape = tuple(fill if d is None else d for d in shape)
                return builder.new_input(
                    ShapedArray(shape, _np_dtype(standardize_dtype(x.dtype)))
                )
            return x

        args, kwargs = tree.map_structure(to_tracer, (args, kwargs))
        _spec_builders.add(builder)
        try:
            with tracing(builder):
                outputs = fn(*args, **kwargs)
        finally:
            _spec_builders.discard(builder)

        def to_keras_tensor(x):
            if isinstance(x, _TENSOR_TYPES):
                return KerasTensor(x.shape, standardize_dtype(x.dtype))
            return x

        return tree.map_structure(to_keras_tensor, outputs)


def random_seed_dtype():
    # The seed state is two uint32 words, as Keras' other backends use.
    return "uint32"


def stop_gradient(variable):
    from keras_ipu.backend.control_flow import stop_gradient as _stop

    if isinstance(variable, Variable):
        variable = variable.value
    return _stop(convert_to_tensor(variable))


class name_scope(base_name_scope):
    pass


def _layer_path():
    # Layer.__call__ enters name_scope(layer.name): the scope path names the
    # Keras layer (and its parents) that records a traced node. (A pipelined
    # model's stage is recorded beside it: trace.stage_scope.)
    from keras.src.backend.common.name_scope import current_path

    return current_path() or None


_set_source_provider(_layer_path)


@contextlib.contextmanager
def device_scope(device_name):
    """Keras' device placement: "cpu:N" runs eagerly on the host; "ipu:N"
    (and "gpu:N", accepted for portable scripts) select the simulated IPU."""
    if not isinstance(device_name, str):
        raise ValueError(
            "Invalid value for argument `device_name`. Expected a string like "
            f"'cpu:0' or 'ipu:0'. Received: device_name={device_name!r}"
        )
    device_name = device_name.lower()
    kind = device_name.split(":")[0].lstrip("/").replace("device", "").strip(":")
    if kind not in ("cpu", "ipu", "gpu"):
        raise ValueError(
            f"Unknown device {device_name!r}: the ipu backend has 'cpu:N' "
            "(the host) and 'ipu:N' (the simulated IPUs)."
        )
    previous = global_state.get_global_attribute("device_scope")
    global_state.set_global_attribute("device_scope", device_name)
    try:
        yield
    finally:
        global_state.set_global_attribute("device_scope", previous)


def custom_gradient(fun):
    from keras_ipu.backend.control_flow import custom_gradient as _cg

    return _cg(fun)


def remat(f):
    from keras_ipu.backend.control_flow import remat as _remat

    return _remat(f)


def _warn_once(message, _seen=set()):
    if message not in _seen:
        _seen.add(message)
        warnings.warn(message, stacklevel=3)


# Control flow and indexing live in their own modules; Keras looks them up
# on `core`.
from keras_ipu.backend.control_flow import associative_scan  # noqa: E402
from keras_ipu.backend.control_flow import cond  # noqa: E402
from keras_ipu.backend.control_flow import fori_loop  # noqa: E402
from keras_ipu.backend.control_flow import map  # noqa: E402,A004
from keras_ipu.backend.control_flow import scan  # noqa: E402
from keras_ipu.backend.control_flow import switch  # noqa: E402
from keras_ipu.backend.control_flow import vectorized_map  # noqa: E402
from keras_ipu.backend.control_flow import while_loop  # noqa: E402
from keras_ipu.backend.indexing import scatter  # noqa: E402
from keras_ipu.backend.indexing import scatter_update  # noqa: E402
from keras_ipu.backend.indexing import slice  # noqa: E402,A004
from keras_ipu.backend.indexing import slice_update  # noqa: E402
from keras_ipu.backend.indexing import unstack  # noqa: E402
