"""HLO opcodes that make or rearrange arrays: constant, iota, broadcast,
reshape, transpose, slice, dynamic-slice, dynamic-update-slice,
concatenate, pad, reverse, copy, opt-barrier, tuples and tokens, and
set-dimension-size (a static size in static programs).
"""

import numpy as np

from keras_ipu.device.primitives import indexing
from keras_ipu.device.primitives import structure
from keras_ipu.frontends.tensorflow import hlo_proto
from keras_ipu.frontends.tensorflow.importer import Broadcast
from keras_ipu.frontends.tensorflow.importer import HloImportError
from keras_ipu.frontends.tensorflow.importer import TOKEN
from keras_ipu.frontends.tensorflow.importer import dtype_of
from keras_ipu.frontends.tensorflow.importer import rule
from keras_ipu.frontends.tensorflow.importer import shape_of


def out_shape(instr):
    return tuple(int(d) for d in instr.shape.dimensions)


def out_dtype(instr):
    return hlo_proto.dtype_of(instr.shape.element_type)


@rule("constant")
def _constant(imp, instr, operands):
    return hlo_proto.literal_value(instr.literal)


@rule("iota")
def _iota(imp, instr, operands):
    (dimension,) = instr.dimensions
    shape = out_shape(instr)
    ramp_shape = tuple(n if i == dimension else 1 for i, n in enumerate(shape))
    ramp = imp.bind(structure.iota_p, dtype=out_dtype(instr), shape=ramp_shape,
                    dimension=int(dimension))
    if ramp_shape == shape:
        return ramp
    return Broadcast(ramp, shape)


@rule("broadcast")
def _broadcast(imp, instr, operands):
    """Kept pending: the operand with size-1 axes where the result
    broadcasts (transposed first when `dimensions` is not increasing)."""
    (x,) = operands
    shape = out_shape(instr)
    dims = [int(d) for d in instr.dimensions]
    x = imp.raw(x) if not isinstance(x, Broadcast) else imp.array(x)
    if imp.vectorized and not shape:
        return x
    if dims != sorted(dims):
        order = sorted(range(len(dims)), key=lambda i: dims[i])
        x = imp.bind(structure.transpose_p, x, permutation=tuple(order))
        dims = sorted(dims)
    small = [1] * len(shape)
    for axis, d in zip(dims, shape_of(x)):
        small[axis] = d
    small = tuple(small)
    if tuple(shape_of(x)) != small:
        x = imp.bind(structure.reshape_p, x, new_shape=small)
    if small == shape:
        return x
    return Broadcast(x, shape)


def reshape(imp, x, shape):
    shape = tuple(shape)
    if isinstance(x, Broadcast):
        # A broadcast whose size-1 axes only gain or lose ones stays pending.
        x = imp.array(x)
    if tuple(shape_of(x)) == shape:
        return x
    return imp.bind(structure.reshape_p, x, new_shape=shape)


@rule("reshape")
def _reshape(imp, instr, operands):
    (x,) = operands
    if imp.vectorized and not out_shape(instr):
        return x
    return reshape(imp, x, out_shape(instr))


def transpose(imp, x, perm):
    perm = tuple(int(p) for p in perm)
    if perm == tuple(range(len(perm))):
        return x
    if isinstance(x, Broadcast):
        small = imp.bind(structure.transpose_p, x.value, permutation=perm)
        return Broadcast(small, tuple(x.shape[p] for p in perm))
    return imp.bind(structure.transpose_p, x, permutation=perm)


@rule("transpose")
def _transpose(imp, instr, operands):
    (x,) = operands
    return transpose(imp, x, instr.dimensions)


@rule("copy", "opt-barrier")
def _identity(imp, instr, operands):
    (x,) = operands
    return x


@rule("slice")
def _slice(imp, instr, operands):
    (x,) = operands
    starts = tuple(int(s.start) for s in instr.slice_dimensions)
    limits = tuple(int(s.limit) for s in instr.slice_dimensions)
    strides = tuple(int(s.stride) for s in instr.slice_dimensions)
    if starts == (0,) * len(starts) and limits == shape_of(x) and set(strides) <= {1}:
        return x
    return imp.bind(indexing.slice_p, imp.array(x), start_indices=starts,
                    limit_indices=limits, strides=strides)


def scalar_index(imp, i):
    """A 0-d operand (an index, a padding value) as a full array."""
    i = imp.array(i)
    if shape_of(i):
        i = reshape(imp, i, ())
    return i


@rule("dynamic-slice")
def _dynamic_slice(imp, instr, operands):
    x, *starts = operands
    sizes = tuple(int(s) for s in instr.dynamic_slice_sizes)
    starts = [scalar_index(imp, s) for s in starts]
    return imp.bind(indexing.dynamic_slice_p, imp.array(x), *starts, slice_sizes=sizes)


@rule("dynamic-update-slice")
def _dynamic_update_slice(imp, instr, operands):
    x, update, *starts = operands
    starts = [scalar_index(imp, s) for s in starts]
    return imp.bind(indexing.dynamic_update_slice_p, imp.array(x), imp.array(update), *starts)


@rule("concatenate")
def _concatenate(imp, instr, operands):
    (axis,) = instr.dimensions
    parts = [imp.array(x) for x in operands if shape_of(x)[axis] != 0]
    if len(parts) == 1:
        return parts[0]
    return imp.bind(structure.concatenate_p, *parts, axis=int(axis))


@rule("pad")
def _pad(imp, instr, operands):
    x, value = operands
    config = tuple(
        (int(d.edge_padding_low), int(d.edge_padding_high), int(d.interior_padding))
        for d in instr.padding_config.dimensions
    )
    if all(c == (0, 0, 0) for c in config):
        return x
    return imp.bind(structure.pad_p, imp.array(x), scalar_index(imp, value), config=config)


@rule("reverse")
def _reverse(imp, instr, operands):
    (x,) = operands
    axes = tuple(int(d) for d in instr.dimensions)
    if not axes:
        return x
    return imp.bind(structure.rev_p, imp.array(x), axes=axes)


@rule("set-dimension-size")
def _set_dimension_size(imp, instr, operands):
    """Static programs: the size set must be the static size (TensorFlow
    marks sorts and top_k this way); a smaller runtime size would make the
    shape depend on values, which an IPU program cannot have."""
    x, size = operands
    (dim,) = instr.dimensions
    static = shape_of(x)[dim]
    if isinstance(size, np.ndarray) and int(size) == static:
        return x
    raise HloImportError(
        f"set-dimension-size gives axis {dim} (static size {static}) a size "
        "only known when the program runs; IPU programs have static shapes. "
        "Make the TensorFlow op's output shape static (for example with "
        "padded, fixed-size inputs)."
    )


@rule("after-all")
def _after_all(imp, instr, operands):
    return TOKEN


@rule("tuple")
def _tuple(imp, instr, operands):
    return tuple(operands)


@rule("get-tuple-element")
def _get_tuple_element(imp, instr, operands):
    (t,) = operands
    return t[instr.tuple_index]
