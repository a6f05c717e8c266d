"""Lowering of one primitive application to a callable kernel.

Generic case: the primitive's own kernel with its params pre-bound. Fast
case: a float elementwise primitive whose operands already have the output
dtype maps straight onto its NumPy ufunc, skipping the eager kernel's
per-call shape-rule check; ufuncs also accept `out=`, which fusion uses to
reuse buffers. The executable silences floating-point warnings around the
whole run, as the eager kernels do per call.
"""

import functools

import numpy as np

from keras_ipu.device.primitives import elementwise
from keras_ipu.device.primitives import special
from keras_ipu.device.primitives.convert import convert_element_type_p
from keras_ipu.device.primitives.registry import Primitive

UFUNCS = {
    "add": np.add,
    "sub": np.subtract,
    "mul": np.multiply,
    "div": np.true_divide,
    "max": np.maximum,
    "min": np.minimum,
    "pow": np.power,
    "neg": np.negative,
    "abs": np.absolute,
    "exp": np.exp,
    "expm1": np.expm1,
    "log": np.log,
    "log1p": np.log1p,
    "sqrt": np.sqrt,
    "square": np.square,
    "reciprocal": np.reciprocal,
    "tanh": np.tanh,
    "sin": np.sin,
    "cos": np.cos,
    "floor": np.floor,
    "ceil": np.ceil,
}

_UFUNC_DTYPES = frozenset(np.dtype(t) for t in (np.float16, np.float32, np.float64))


def _module_primitives(module):
    return {v for v in vars(module).values() if isinstance(v, Primitive)}


ELEMENTWISE = frozenset(
    _module_primitives(elementwise)
    | _module_primitives(special)
    | {convert_element_type_p}
)


def is_elementwise(primitive):
    return primitive in ELEMENTWISE


def fast_ufunc(primitive, in_avals, out_aval):
    """The NumPy ufunc computing this application exactly, or None."""
    ufunc = UFUNCS.get(primitive.name)
    if ufunc is None or out_aval.dtype not in _UFUNC_DTYPES:
        return None
    if any(a.dtype != out_aval.dtype for a in in_avals):
        return None
    return ufunc


def _wrapped(kernel, fn):
    kernel.__name__ = getattr(fn, "__name__", "kernel")
    # What str(executable) shows of the kernel: generated code, sub-programs.
    for attr in ("source", "subprograms"):
        if hasattr(fn, attr):
            setattr(kernel, attr, getattr(fn, attr))
    return kernel


def _as_array(fn):
    # 0-d results of ufuncs are NumPy scalars; keep every value an ndarray.
    def kernel(*xs):
        return np.asarray(fn(*xs))

    return _wrapped(kernel, fn)


def _as_arrays(fn):
    def kernel(*xs):
        return tuple(np.asarray(o) for o in fn(*xs))

    return _wrapped(kernel, fn)


def lower(primitive, params, in_avals, out_avals):
    """A callable f(*ndarrays) -> ndarray (or tuple if multiple results)."""
    builder = LOWERINGS.get(primitive.name)
    if builder is not None:
        return builder(params, in_avals, out_avals)  # returns ndarrays
    fn = None
    if not primitive.multiple_results:
        fn = fast_ufunc(primitive, in_avals, out_avals[0])
    if fn is None:
        fn = primitive.kernel
        if params:
            fn = functools.partial(fn, **params)
    if primitive.multiple_results:
        if any(a.ndim == 0 for a in out_avals):
            fn = _as_arrays(fn)
    elif out_avals[0].ndim == 0:
        fn = _as_array(fn)
    return fn


# Primitives with their own lowering (name -> builder(params, in_avals,
# out_avals) -> callable returning ndarrays, never NumPy scalars): filled
# in by the modules that define them.
LOWERINGS = {}
