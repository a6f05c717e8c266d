"""gather and scatter with XLA's dimension numbers, on the gather/scatter
primitives (which index the leading axes of the operand with rows of
indices and take the remaining axes whole).

The operand is transposed so the indexed axes (`start_index_map`,
`scatter_dims_to_operand_dims`) come first; windows wider than one element
along an indexed axis become more index rows (start + offset); the result
is transposed to XLA's output layout. XLA's bounds rules are kept: gather
clamps every start so the window fits; scatter skips a window that does
not fit (negative starts included).
"""

import itertools

import numpy as np

from keras_ipu.device.primitives import elementwise as ew
from keras_ipu.device.primitives import indexing
from keras_ipu.device.primitives import reduce as red
from keras_ipu.device.primitives import structure
from keras_ipu.frontends.tensorflow.importer import HloImportError
from keras_ipu.frontends.tensorflow.importer import dtype_of
from keras_ipu.frontends.tensorflow.importer import rule
from keras_ipu.frontends.tensorflow.importer import shape_of
from keras_ipu.frontends.tensorflow.opcodes.reductions import monoid
from keras_ipu.frontends.tensorflow.opcodes.shapes import reshape
from keras_ipu.frontends.tensorflow.opcodes.shapes import transpose


def _index_rows(imp, indices, index_vector_dim):
    """Indices as batch + (k,)."""
    shape = shape_of(indices)
    if index_vector_dim == len(shape):
        return reshape(imp, indices, shape + (1,))
    perm = [a for a in range(len(shape)) if a != index_vector_dim] + [index_vector_dim]
    return transpose(imp, indices, perm)


def _expand(imp, rows, sizes):
    """rows (batch + (k,)) plus every offset of a window with `sizes` per
    indexed axis: batch + wide + (k,), `wide` being the sizes > 1."""
    wide = [s for s in sizes if s > 1]
    if not wide:
        return rows, []
    k = len(sizes)
    offsets = np.zeros(tuple(wide) + (k,), dtype=dtype_of(rows))
    axes = [j for j, s in enumerate(sizes) if s > 1]
    for pos in itertools.product(*(range(s) for s in wide)):
        for j, p in zip(axes, pos):
            offsets[pos + (j,)] = p
    batch = shape_of(rows)[:-1]
    rows = reshape(imp, rows, batch + (1,) * len(wide) + (k,))
    return imp.bind(ew.add_p, rows, offsets), wide


@rule("gather")
def _gather(imp, instr, operands):
    x, indices = (imp.array(v) for v in operands)
    dn = instr.gather_dimension_numbers
    if list(dn.operand_batching_dims) or list(dn.start_indices_batching_dims):
        raise HloImportError("gather with batching dimensions is not supported yet.")
    sizes = [int(s) for s in instr.gather_slice_sizes]
    shape = shape_of(x)
    index_map = [int(d) for d in dn.start_index_map]
    collapsed = set(int(d) for d in dn.collapsed_slice_dims)
    offset_dims = [int(d) for d in dn.offset_dims]
    others = [d for d in range(len(shape)) if d not in index_map]
    # Axes read from offset 0: take the window's prefix now.
    if any(sizes[d] != shape[d] for d in others):
        limits = tuple(sizes[d] if d in others else shape[d] for d in range(len(shape)))
        x = imp.bind(indexing.slice_p, x, start_indices=(0,) * len(shape),
                     limit_indices=limits, strides=(1,) * len(shape))
    x = transpose(imp, x, index_map + others)
    rows = _index_rows(imp, indices, int(dn.index_vector_dim))
    batch = shape_of(rows)[:-1]
    # Clamp each start so its window fits (XLA).
    hi = np.asarray([shape[d] - sizes[d] for d in index_map], dtype=dtype_of(rows))
    rows = imp.bind(ew.clamp_p, np.zeros((), dtype_of(rows)), rows, hi)
    rows, wide = _expand(imp, rows, [sizes[d] for d in index_map])
    out = imp.bind(indexing.gather_p, x, rows, mode="clip")
    # out axes: batch, the wide indexed axes, the other axes. Label them
    # by operand dim and lay them out as XLA does.
    labels = [("b", i) for i in range(len(batch))]
    labels += [("o", d) for d in index_map if sizes[d] > 1]
    labels += [("o", d) for d in others]
    dims = list(shape_of(out))
    # Collapsed axes of the prefix slice have size 1: drop them; indexed
    # axes of size 1 that are not collapsed: add them.
    keep = [i for i, (kind, d) in enumerate(labels) if not (kind == "o" and d in collapsed)]
    labels = [labels[i] for i in keep]
    dims = [dims[i] for i in keep]
    for d in index_map:
        if sizes[d] == 1 and d not in collapsed:
            labels.append(("o", d))
            dims.append(1)
    out = reshape(imp, out, tuple(dims))
    offset_labels = sorted((lab for lab in labels if lab[0] == "o"), key=lambda lab: lab[1])
    batch_labels = [lab for lab in labels if lab[0] == "b"]
    order = []
    rank = len(offset_labels) + len(batch_labels)
    it_o, it_b = iter(offset_labels), iter(batch_labels)
    for pos in range(rank):
        order.append(next(it_o) if pos in offset_dims else next(it_b))
    return transpose(imp, out, [labels.index(lab) for lab in order])


_SCATTER_MODES = {"add": "add", "multiply": "mul", "maximum": "max", "minimum": "min"}


def _scatter_mode(comp):
    op = monoid(comp)
    if op in _SCATTER_MODES:
        return _SCATTER_MODES[op]
    by_id = {i.id: i for i in comp.instructions}
    root = by_id[comp.root_id]
    if root.opcode == "parameter" and root.parameter_number == 1:
        return "update"
    raise HloImportError(
        f"the scatter's update computation {comp.name!r} is not one of add, "
        "multiply, maximum, minimum or a replacement."
    )


@rule("scatter")
def _scatter(imp, instr, operands):
    if len(operands) != 3:
        raise HloImportError("variadic scatter (several operands) is not supported yet.")
    x, indices, updates = (imp.array(v) for v in operands)
    dn = instr.scatter_dimension_numbers
    if list(dn.input_batching_dims) or list(dn.scatter_indices_batching_dims):
        raise HloImportError("scatter with batching dimensions is not supported yet.")
    mode = _scatter_mode(imp.called(instr))
    shape = shape_of(x)
    rank = len(shape)
    index_map = [int(d) for d in dn.scatter_dims_to_operand_dims]
    inserted = set(int(d) for d in dn.inserted_window_dims)
    window_dims = [int(d) for d in dn.update_window_dims]
    u_shape = shape_of(updates)
    scatter_dims = [a for a in range(len(u_shape)) if a not in window_dims]
    # Window size per operand dim (1 where inserted).
    window_of = [d for d in range(rank) if d not in inserted]
    size = [1] * rank
    u_axis = {}
    for a, d in zip(window_dims, window_of):
        size[d] = u_shape[a]
        u_axis[d] = a
    others = [d for d in range(rank) if d not in index_map]
    if dtype_of(updates) != dtype_of(x):
        from keras_ipu.device.primitives import convert as cv

        updates = imp.bind(cv.convert_element_type_p, updates, dtype=dtype_of(x))
    rows = _index_rows(imp, imp.array(indices), int(dn.index_vector_dim))
    idt = dtype_of(rows)
    # A window that does not fit is skipped: its rows point past the end.
    lo_ok = imp.bind(ew.ge_p, rows, np.zeros((), idt))
    hi = np.asarray([shape[d] - size[d] for d in index_map], dtype=idt)
    fits = imp.bind(red.reduce_and_p, imp.bind(ew.and_p, lo_ok, imp.bind(ew.le_p, rows, hi)),
                    axes=(len(shape_of(rows)) - 1,))
    past = np.asarray([shape[d] for d in index_map], dtype=idt)
    fits = reshape(imp, fits, shape_of(fits) + (1,))
    rows = imp.bind(ew.select_p, fits, rows, past)
    rows, wide = _expand(imp, rows, [size[d] for d in index_map])
    # Updates as: scatter dims, the wide indexed window axes, the other
    # operand dims (their window axes, size 1 where inserted).
    u_perm = scatter_dims + [u_axis[d] for d in index_map if size[d] > 1]
    u = transpose(imp, updates, u_perm + [a for a in range(len(u_shape)) if a not in u_perm])
    u_dims = [u_shape[a] for a in u_perm] + [size[d] for d in others]
    u = reshape(imp, u, tuple(u_dims))
    target = transpose(imp, x, index_map + others)
    prefix = tuple(size[d] for d in others)
    whole = tuple(shape[d] for d in others)
    if prefix != whole:
        k = len(index_map)
        lead = tuple(shape[d] for d in index_map)
        part = imp.bind(indexing.slice_p, target, start_indices=(0,) * rank,
                        limit_indices=lead + prefix, strides=(1,) * rank)
        part = imp.bind(indexing.scatter_p, part, rows, u, mode=mode)
        zero = np.zeros((), dtype=np.int32)
        out = imp.bind(indexing.dynamic_update_slice_p, target, part, *([zero] * rank))
        del k
    else:
        out = imp.bind(indexing.scatter_p, target, rows, u, mode=mode)
    inverse = np.argsort(index_map + others)
    return transpose(imp, out, inverse)
