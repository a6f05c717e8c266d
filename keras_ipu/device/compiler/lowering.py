"""Lowering of one primitive application to a callable kernel.

Generic case: the primitive's own kernel with its params pre-bound. Fast
case: an elementwise primitive whose operands already have the output
dtype maps straight onto its NumPy ufunc (its `ufunc` fact), skipping the
eager kernel's per-call shape-rule check; ufuncs also accept `out=`, which
fusion uses to reuse buffers. The executable silences floating-point
warnings around the whole run, as the eager kernels do per call.
"""

import functools

import numpy as np

from keras_ipu.device.compiler.host_memory import tune_malloc
from keras_ipu.device.native import threads as host_threads
from keras_ipu.device.native.leading_axis import split_kernel
from keras_ipu.device.primitives.convert import convert_element_type_p
from keras_ipu.device.primitives.elementwise import select_p


def fast_ufunc(primitive, in_avals, out_aval):
    """The NumPy ufunc computing this application exactly (the primitive's
    `ufunc` fact, for the operand and output dtypes it holds for), or None."""
    ufunc = primitive.ufunc
    if ufunc is None:
        return None
    if primitive.ufunc_kinds == "*":  # any operands, a bool result
        return ufunc
    dtype = out_aval.dtype
    if any(a.dtype != dtype for a in in_avals):
        return None
    return ufunc if dtype.kind in primitive.ufunc_kinds else None


# np.where branches per element: on an unpredictable mask (a ReLU's) it
# runs at a few ns per element. Selecting bits with a mask of all-ones or
# zeros is branch-free and exact for every value (NaN payloads, -0.0).
_BIT_SELECT_MIN_SIZE = 4096
_UINTS = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def select_kernel(in_avals, out_aval):
    """select(pred, on_true, on_false) for operands of the output dtype."""
    dtype, shape = out_aval.dtype, out_aval.shape
    size = int(np.prod(shape, dtype=np.int64)) if shape else 1
    if (
        dtype.kind not in "biuf"
        or dtype.itemsize not in _UINTS
        or size < _BIT_SELECT_MIN_SIZE
        or not out_aval.is_static()
    ):
        return np.where
    uint = np.dtype(_UINTS[dtype.itemsize])
    pred, on_true, on_false = in_avals
    shape = tuple(shape)
    # (m & a) | (~m & b) == b ^ (m & (a ^ b)), computed in place in
    # whichever temporary already has the full shape.
    if tuple(pred.shape) == shape:
        into = "mask"
    elif tuple(np.broadcast_shapes(on_true.shape, on_false.shape)) == shape:
        into = "diff"
    else:
        into = None
    band, bxor, neg = np.bitwise_and, np.bitwise_xor, np.negative
    u8 = np.uint8

    def bit_select(p, a, b):
        mask = neg(p.view(u8), dtype=uint)  # True -> all ones
        bits = b.view(uint)
        diff = bxor(a.view(uint), bits)
        if into == "mask":
            band(mask, diff, out=mask)
            return bxor(mask, bits, out=mask).view(dtype)
        if into == "diff":
            band(diff, mask, out=diff)
            return bxor(diff, bits, out=diff).view(dtype)
        return bxor(band(mask, diff), bits).view(dtype)

    return bit_select


def _identity(x):
    return x


def fast_kernel(primitive, in_avals, out_aval):
    """A callable computing this application exactly without the eager
    kernel's per-call checks (not a ufunc: no `out=`), or None. Its result
    may alias an operand (a same-dtype convert returns it)."""
    dtype = out_aval.dtype
    if primitive is select_p:
        _, on_true, on_false = in_avals
        if on_true.dtype == dtype and on_false.dtype == dtype:
            return select_kernel(in_avals, out_aval)
        return None
    if primitive.float_kernel is not None and dtype.kind == "f":
        if all(a.dtype == dtype for a in in_avals):
            # The eager kernel's function without its per-call checks: on
            # float operands it returns their dtype already.
            return primitive.float_kernel
        return None
    if primitive is convert_element_type_p:
        (x,) = in_avals
        if x.dtype == dtype:
            return _identity
        # What the kernel does in these cases: a plain astype (float to
        # int and anything from complex have their own rules there).
        if x.dtype.kind in "biuf" and (
            dtype.kind == "f" or (dtype.kind in "iu" and x.dtype.kind in "biu")
        ):
            def astype(v):
                return v.astype(dtype)

            return astype
    return None


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
    tune_malloc()  # once per process: compiled programs reuse heap blocks
    host_threads.configure()  # once: the kernels pick their threads
    builder = LOWERINGS.get(primitive.name)
    if builder is not None:  # returns ndarrays
        return split_kernel(primitive, params, in_avals, out_avals,
                            builder(params, in_avals, out_avals))
    fn = ufunc = None
    if not primitive.multiple_results:
        fn = ufunc = fast_ufunc(primitive, in_avals, out_avals[0])
        if fn is None:
            fn = fast_kernel(primitive, in_avals, out_avals[0])
    if fn is None:
        fn = primitive.kernel
        if params:
            fn = functools.partial(fn, **params)
    if primitive.multiple_results:
        if any(a.ndim == 0 for a in out_avals):
            fn = _as_arrays(fn)
    elif out_avals[0].ndim == 0:
        fn = _as_array(fn)
    # Large memory-bound kernels (pads, sums, pooling, broadcast adds) on
    # the threads their size is worth, as the products and chains are.
    return split_kernel(primitive, params, in_avals, out_avals, fn, ufunc)


# Primitives with their own lowering (name -> builder(params, in_avals,
# out_avals) -> callable returning ndarrays, never NumPy scalars): filled
# in by the modules that define them.
LOWERINGS = {}
# Those of them whose builder takes the params `aligned_outputs`: the
# positions of the node's outputs the program returns, which it allocates
# with host_memory.empty_aligned, and `streamed_outputs`: those of them no
# later node reads, which it may write with non-temporal stores (the
# Executable sets both).
ALIGNED_OUTPUT_LOWERINGS = set()
# Those of them whose builder takes the param `output_order`: the
# permutation of the one transpose that alone reads its result (the
# Executable sets it), None otherwise. The kernel may then lay its result
# out in memory in that order (a view of the same values), so that the
# transpose's result is C-contiguous and its readers copy nothing.
ORDERED_OUTPUT_LOWERINGS = set()
