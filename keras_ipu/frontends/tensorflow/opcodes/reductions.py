"""Reductions: reduce, reduce-window, select-and-scatter.

A reducer computation that is one associative op on its two parameters
(add, multiply, maximum, minimum, and, or) maps to the matching reduction
primitive. Any other reducer, variadic ones included (TensorFlow's argmax
reduces (value, index) pairs), is applied as XLA allows it to be: as a
tree of pairwise combinations, each one the reducer computation applied to
whole arrays at once.
"""

import itertools

import numpy as np

from keras_ipu.device.primitives import elementwise as ew
from keras_ipu.device.primitives import indexing
from keras_ipu.device.primitives import pooling
from keras_ipu.device.primitives import reduce as red
from keras_ipu.device.primitives import structure
from keras_ipu.frontends.tensorflow.importer import HloImportError
from keras_ipu.frontends.tensorflow.importer import dtype_of
from keras_ipu.frontends.tensorflow.importer import rule
from keras_ipu.frontends.tensorflow.importer import shape_of
from keras_ipu.frontends.tensorflow.opcodes.shapes import scalar_index
from keras_ipu.frontends.tensorflow.opcodes.shapes import transpose

# binary opcode -> (reduction primitive, window op, elementwise primitive)
_MONOIDS = {
    "add": (red.reduce_sum_p, "sum", ew.add_p),
    "multiply": (red.reduce_prod_p, None, ew.mul_p),
    "maximum": (red.reduce_max_p, "max", ew.max_p),
    "minimum": (red.reduce_min_p, "min", ew.min_p),
}


def monoid(comp):
    """The opcode of a reducer that is a single binary op on its two
    parameters, or None."""
    by_id = {i.id: i for i in comp.instructions}
    root = by_id[comp.root_id]
    params = {i.id for i in comp.instructions if i.opcode == "parameter"}
    if len(params) != 2 or len(comp.instructions) != 3:
        return None
    if sorted(root.operand_ids) != sorted(params):
        return None
    return root.opcode


def through_calls(imp, comp):
    """The computation `comp` forwards to when it only calls another with
    its parameters in order (tf2xla wraps the functions of XlaReduce,
    XlaSelectAndScatter and the like so), else `comp`."""
    while True:
        by_id = {i.id: i for i in comp.instructions}
        root = by_id[comp.root_id]
        params = sorted((i.parameter_number, i.id) for i in comp.instructions
                        if i.opcode == "parameter")
        if (len(comp.instructions) != len(params) + 1 or root.opcode != "call"
                or list(root.operand_ids) != [i for _, i in params]):
            return comp
        comp = imp.called(root)


def _identity(op, dtype):
    dtype = np.dtype(dtype)
    if op == "add" or op == "or" or op == "xor":
        return 0
    if op == "multiply":
        return 1
    if op == "and":
        return True if dtype == np.bool_ else -1
    if dtype == np.bool_:
        return op == "minimum"
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return info.min if op == "maximum" else info.max
    return -np.inf if op == "maximum" else np.inf


def _is_identity(value, op, dtype):
    if not isinstance(value, np.ndarray):
        return False
    with np.errstate(all="ignore"):
        return bool(np.all(value == np.asarray(_identity(op, dtype)).astype(dtype)))


def _reduction_primitive(op, dtype):
    if op in _MONOIDS:
        return _MONOIDS[op][0]
    if dtype == np.bool_ and op == "and":
        return red.reduce_and_p
    if dtype == np.bool_ and op == "or":
        return red.reduce_or_p
    return None


@rule("reduce")
def _reduce(imp, instr, operands):
    n = len(operands) // 2
    inputs, inits = operands[:n], operands[n:]
    axes = tuple(int(d) for d in instr.dimensions)
    comp = imp.called(instr)
    op = monoid(comp) if n == 1 else None
    if op is not None:
        (x,), (init,) = inputs, inits
        prim = _reduction_primitive(op, dtype_of(x))
        if prim is not None:
            if not axes:
                out = x
            else:
                out = imp.bind(prim, imp.array(x), axes=axes)
            if not _is_identity(init, op, dtype_of(x)):
                combine = _MONOIDS[op][2] if op in _MONOIDS else {
                    "and": ew.and_p, "or": ew.or_p}[op]
                out = imp.bind(combine, out, scalar_index(imp, init))
            return out
    return _tree_reduce(imp, comp, [imp.array(x) for x in inputs],
                        [scalar_index(imp, i) for i in inits], axes)


def _tree_reduce(imp, comp, xs, inits, axes):
    """Reduce `axes` of the arrays `xs` with the reducer `comp` by halving:
    the reduced axes are moved last and flattened, then the two halves are
    combined (the odd one out padded with the init values) until one
    element is left, then combined with the init values."""
    shape = shape_of(xs[0])
    keep = [a for a in range(len(shape)) if a not in axes]
    perm = keep + list(axes)
    kept_shape = tuple(shape[a] for a in keep)
    count = int(np.prod([shape[a] for a in axes], dtype=np.int64))
    flat = []
    for x in xs:
        x = transpose(imp, x, perm)
        flat.append(imp.bind(structure.reshape_p, x, new_shape=kept_shape + (count,)))
    last = len(kept_shape)

    def part(x, start, stop):
        starts = (0,) * last + (start,)
        limits = kept_shape + (stop,)
        return imp.bind(indexing.slice_p, x, start_indices=starts, limit_indices=limits,
                        strides=(1,) * (last + 1))

    while count > 1:
        if count % 2:
            flat = [imp.bind(structure.concatenate_p, x,
                             imp.bind(structure.broadcast_to_p,
                                      imp.bind(structure.reshape_p, i, new_shape=(1,) * (last + 1)),
                                      shape=kept_shape + (1,)),
                             axis=last)
                    for x, i in zip(flat, inits)]
            count += 1
        half = count // 2
        lhs = [part(x, 0, half) for x in flat]
        rhs = [part(x, half, count) for x in flat]
        out = imp.scalar_computation(comp, *lhs, *rhs)
        flat = list(out) if isinstance(out, tuple) else [out]
        count = half
    if count == 0:
        results = [imp.bind(structure.broadcast_to_p, i, shape=kept_shape) for i in inits]
    else:
        results = [imp.bind(structure.reshape_p, x, new_shape=kept_shape) for x in flat]
        out = imp.scalar_computation(comp, *results, *inits)
        results = list(out) if isinstance(out, tuple) else [out]
    return results[0] if len(xs) == 1 else tuple(results)


def _window(instr, rank):
    dims = list(instr.window.dimensions)
    if len(dims) != rank:
        raise HloImportError(f"the window has {len(dims)} dimensions for an operand of rank {rank}.")
    if any(d.window_reversal for d in dims):
        raise HloImportError("window reversal in a reduce-window is not supported.")
    return (
        tuple(int(d.size) for d in dims),
        tuple(int(d.stride) or 1 for d in dims),
        tuple((int(d.padding_low), int(d.padding_high)) for d in dims),
        tuple(int(d.base_dilation) or 1 for d in dims),
        tuple(int(d.window_dilation) or 1 for d in dims),
    )


@rule("reduce-window")
def _reduce_window(imp, instr, operands):
    n = len(operands) // 2
    inputs, inits = operands[:n], operands[n:]
    comp = imp.called(instr)
    size, stride, padding, base, dil = _window(instr, len(shape_of(inputs[0])))
    op = monoid(comp) if n == 1 else None
    window_op = _MONOIDS.get(op, (None, None))[1] if op else None
    if window_op is not None and _is_identity(inits[0], op, dtype_of(inputs[0])):
        return imp.bind(pooling.reduce_window_p, imp.array(inputs[0]), op=window_op,
                        window_dimensions=size, window_strides=stride, padding=padding,
                        base_dilation=base, window_dilation=dil)
    return _generic_reduce_window(imp, comp, [imp.array(x) for x in inputs],
                                  [scalar_index(imp, i) for i in inits],
                                  size, stride, padding, base, dil)


def _taps(size, stride, padding, base, dil, shape, out_shape):
    """Per window tap: the strided slice of the padded operand it reads
    (start, limit, stride per axis)."""
    for tap in itertools.product(*(range(s) for s in size)):
        starts = tuple(t * d for t, d in zip(tap, dil))
        limits = tuple(s + (n - 1) * st + 1 if n else s
                       for s, n, st in zip(starts, out_shape, stride))
        yield tap, starts, limits


def _padded(imp, x, init, padding, base):
    config = tuple((lo, hi, b - 1) for (lo, hi), b in zip(padding, base))
    if all(c == (0, 0, 0) for c in config):
        return x
    return imp.bind(structure.pad_p, x, init, config=config)


def _out_shape(shape, size, stride, padding, base, dil):
    out = []
    for n, k, s, (lo, hi), b, d in zip(shape, size, stride, padding, base, dil):
        n = (n - 1) * b + 1 if n else 0
        span = n + lo + hi - ((k - 1) * d + 1)
        out.append(span // s + 1 if span >= 0 else 0)
    return tuple(out)


def _generic_reduce_window(imp, comp, xs, inits, size, stride, padding, base, dil):
    """One strided slice per window tap combined with the reducer: a
    window of k taps costs k elementwise passes over the output."""
    shape = shape_of(xs[0])
    out_shape = _out_shape(shape, size, stride, padding, base, dil)
    padded = [_padded(imp, x, i, padding, base) for x, i in zip(xs, inits)]
    acc = [imp.bind(structure.broadcast_to_p, i, shape=out_shape) for i in inits]
    if 0 in out_shape:
        return acc[0] if len(xs) == 1 else tuple(acc)
    for _, starts, limits in _taps(size, stride, padding, base, dil, shape, out_shape):
        views = [imp.bind(indexing.slice_p, p, start_indices=starts, limit_indices=limits,
                          strides=stride) for p in padded]
        out = imp.scalar_computation(comp, *acc, *views)
        acc = list(out) if isinstance(out, tuple) else [out]
    return acc[0] if len(xs) == 1 else tuple(acc)


# A select computation `compare(pick, tap)` keeps the first extremum of a
# window: GE the first maximum, LE the first minimum.
_FIRST_EXTREMUM = {"GE": "max", "LE": "min"}


def _first_extremum(comp):
    """'max' or 'min' where the select computation is one GE or LE
    compare of its parameters in order (TensorFlow's max-pool gradient
    is GE), else None."""
    by_id = {i.id: i for i in comp.instructions}
    root = by_id[comp.root_id]
    params = {i.parameter_number: i.id for i in comp.instructions if i.opcode == "parameter"}
    if (len(comp.instructions) != 3 or root.opcode != "compare"
            or list(root.operand_ids) != [params.get(0), params.get(1)]):
        return None
    return _FIRST_EXTREMUM.get(root.comparison_direction)


@rule("select-and-scatter")
def _select_and_scatter(imp, instr, operands):
    """XLA's select-and-scatter (the gradient of max pooling): in each
    window the `select` computation picks one element of the operand (taps
    visited in order; a tap replaces the current pick when `select(pick,
    tap)` is false; padding is never picked), and the window's `source`
    value is scattered to it with the `scatter` computation (add).

    A GE or LE select (the first maximum or minimum) on floats is the
    device's select_and_scatter_add of the window results: one kernel, and
    MaxPoolGrad on TensorFlow's engines. It differs from XLA only where a
    window holds a NaN (XLA's GE picks per its comparisons, the primitive
    picks nothing). Any other select is applied tap by tap: each tap is a
    strided view of the operand, the picks are masks, and each tap's share
    is padded back into place (the transpose of its strided view)."""
    x, source, init = operands
    x, source, init = imp.array(x), imp.array(source), scalar_index(imp, init)
    select_comp = through_calls(imp, imp.called(instr, 0))
    scatter_comp = through_calls(imp, imp.called(instr, 1))
    if monoid(scatter_comp) != "add":
        raise HloImportError("select-and-scatter combines with add only (TensorFlow's max-pool gradients).")
    shape = shape_of(x)
    rank = len(shape)
    size, stride, padding, base, dil = _window(instr, rank)
    if any(b != 1 for b in base):
        raise HloImportError("select-and-scatter with base dilation is not supported.")
    out_shape = shape_of(source)
    dtype = dtype_of(x)
    op = _first_extremum(select_comp)
    if op is not None and np.dtype(dtype).kind == "f" and dtype_of(source) == dtype:
        y = imp.bind(pooling.reduce_window_p, x, op=op, window_dimensions=size,
                     window_strides=stride, padding=padding, base_dilation=base,
                     window_dilation=dil)
        out = imp.bind(pooling.select_and_scatter_add_p, source, x, y, op=op,
                       window_dimensions=size, window_strides=stride, padding=padding,
                       window_dilation=dil)
        if _is_identity(operands[2], "add", dtype):
            return out
        return imp.bind(ew.add_p, out, init)
    # Padding cells get a validity mask of False: they are never picked.
    valid = np.ones(shape, np.bool_)
    config = tuple((lo, hi, 0) for lo, hi in padding)
    xp = imp.bind(structure.pad_p, x, np.zeros((), dtype), config=config)
    vp = imp.bind(structure.pad_p, valid, np.asarray(False), config=config)
    padded_shape = shape_of(xp)
    taps = list(_taps(size, stride, padding, base, dil, shape, out_shape))
    best = best_tap = None
    for k, (_, starts, limits) in enumerate(taps):
        view = imp.bind(indexing.slice_p, xp, start_indices=starts, limit_indices=limits, strides=stride)
        ok = imp.bind(indexing.slice_p, vp, start_indices=starts, limit_indices=limits, strides=stride)
        if best is None:
            best, best_tap, any_ok = view, imp.bind(ew.select_p, ok, np.int32(k), np.int32(-1)), ok
            continue
        keep = imp.scalar_computation(select_comp, best, view)
        take = imp.bind(ew.and_p, ok, imp.bind(ew.or_p, imp.bind(ew.logical_not_p, any_ok),
                                                imp.bind(ew.logical_not_p, keep)))
        best = imp.bind(ew.select_p, take, view, best)
        best_tap = imp.bind(ew.select_p, take, np.int32(k), best_tap)
        any_ok = imp.bind(ew.or_p, any_ok, ok)
    zero = np.zeros((), dtype_of(source))
    acc = None
    for k, (_, starts, limits) in enumerate(taps):
        share = imp.bind(ew.select_p, imp.bind(ew.eq_p, best_tap, np.int32(k)), source, zero)
        back = imp.bind(structure.pad_p, share, zero, config=tuple(
            (s, p - lim, st - 1) for s, lim, p, st in zip(starts, limits, padded_shape, stride)))
        acc = back if acc is None else imp.bind(ew.add_p, acc, back)
    unpad = tuple((-lo, -hi, 0) for lo, hi in padding)
    acc = imp.bind(structure.pad_p, acc, zero, config=unpad)
    return imp.bind(ew.add_p, acc, init)
