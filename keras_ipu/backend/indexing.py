"""Indexing for the ipu backend: `x[key]` with NumPy semantics, and the
keras.ops core functions slice, slice_update, scatter, scatter_update and
unstack (with the semantics of Keras' JAX backend).

`getitem` splits a key into basic parts (ints, slices, None, Ellipsis),
done with static slice / rev / reshape, and advanced parts (integer arrays,
boolean masks, ints mixed with arrays), done with one gather on the
advanced axes moved to the front, as NumPy places them.
"""

import builtins

import numpy as np

from keras_ipu.backend.core import convert_to_tensor
from keras_ipu.backend.numpy import arrays
from keras_ipu.device.array import Tensor
from keras_ipu.device.primitives import dynamic as dyn
from keras_ipu.device.primitives import indexing as ix
from keras_ipu.device.primitives import shape_rules
from keras_ipu.device.primitives import structure as st
from keras_ipu.device.trace import Tracer

_TENSORS = (Tensor, Tracer)


# ---------------------------------------------------------------- getitem


def _classify(entry):
    """One key entry as ('none'|'ellipsis'|'slice'|'int'|'scalar'|'array'|
    'mask', value)."""
    if entry is None:
        return "none", None
    if entry is Ellipsis:
        return "ellipsis", None
    if isinstance(entry, builtins.slice):
        return "slice", _static_slice(entry)
    if isinstance(entry, (bool, np.bool_)):
        # x[True] adds an axis, as NumPy; x[False] would select nothing.
        if entry:
            return "none", None
        raise IndexError("x[False] (an empty selection) is not supported")
    if isinstance(entry, (int, np.integer)):
        return "int", int(entry)
    if hasattr(entry, "value") and not isinstance(entry, _TENSORS):
        entry = convert_to_tensor(entry)  # a Variable
    if not isinstance(entry, _TENSORS):
        entry = np.asarray(entry)
        if entry.dtype == object:
            raise IndexError(f"Invalid index {entry!r}")
    kind = np.dtype(entry.dtype).kind
    if kind == "b":
        return "mask", entry
    if kind not in "iu":
        raise IndexError(
            f"Indices must be integers, slices, None, Ellipsis or boolean "
            f"masks; got an index of dtype {np.dtype(entry.dtype).name}. "
            "Cast float indices with keras.ops.cast(i, 'int32')."
        )
    if entry.ndim == 0:
        if isinstance(entry, np.ndarray):
            return "int", int(entry)
        return "scalar", entry
    return "array", entry


def _static_slice(s):
    parts = []
    for v in (s.start, s.stop, s.step):
        if v is None:
            parts.append(None)
        elif isinstance(v, Tracer):
            raise IndexError(
                "Slice bounds must be static when tracing, got a traced "
                f"value {v.aval.short()}. Use keras.ops.slice(x, start, shape) "
                "for a slice that starts at a traced position."
            )
        else:
            parts.append(int(v))
    if parts[2] == 0:
        raise ValueError("slice step cannot be zero")
    return builtins.slice(*parts)


def _expand_key(key, ndim):
    if not isinstance(key, tuple):
        key = (key,)
    entries = [_classify(k) for k in key]
    if sum(kind == "ellipsis" for kind, _ in entries) > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    used = builtins.sum(
        (v.ndim if kind == "mask" else 1)
        for kind, v in entries
        if kind not in ("none", "ellipsis")
    )
    if used > ndim:
        raise IndexError(
            f"too many indices: the array has rank {ndim} but {used} "
            "dimensions were indexed"
        )
    out = []
    for kind, v in entries:
        if kind == "ellipsis":
            out.extend([("slice", builtins.slice(None))] * (ndim - used))
        else:
            out.append((kind, v))
    if not any(kind == "ellipsis" for kind, _ in entries):
        out.extend([("slice", builtins.slice(None))] * (ndim - used))
    return out


def _check_int(i, dim, axis):
    if dim is not None and not -dim <= i < dim:
        raise IndexError(
            f"index {i} is out of bounds for axis {axis} with size {dim}"
        )


def _apply_slices(x, entries):
    """Apply the slice entries (each consumes one dim of x); other entries
    keep their dims whole."""
    starts, limits, strides, rev_axes = [], [], [], []
    for axis, (kind, v) in enumerate(entries):
        if kind != "slice" or v == builtins.slice(None):
            starts.append(None)
            limits.append(None)
            strides.append(1)
            continue
        start, stop, step = v.start, v.stop, 1 if v.step is None else v.step
        if step < 0:
            # x[a:b:-s] is rev(x)[-a-1:-b-1:s] (None stays None).
            rev_axes.append(axis)
            start = None if start is None else -start - 1
            stop = None if stop is None else -stop - 1
            step = -step
        starts.append(start)
        limits.append(stop)
        strides.append(step)
    if rev_axes:
        x = st.rev_p.bind(x, axes=tuple(rev_axes))
    if any(s is not None for s in starts + limits) or any(s != 1 for s in strides):
        x = ix.slice_p.bind(
            x,
            start_indices=tuple(starts),
            limit_indices=tuple(limits),
            strides=tuple(strides),
        )
    return x


def getitem(x, key):
    x = convert_to_tensor(x)
    entries = _expand_key(key, x.ndim)
    # Newaxis first: a None is a new size-1 dim indexed with `:`.
    if any(kind == "none" for kind, _ in entries):
        # Masks consume several dims.
        new_shape, dims = [], iter(x.shape)
        for kind, v in entries:
            if kind == "none":
                new_shape.append(1)
            elif kind == "mask":
                new_shape.extend(next(dims) for _ in range(v.ndim))
            else:
                new_shape.append(next(dims))
        x = arrays._reshape(x, arrays._fill_unknown(tuple(new_shape)))
        entries = [
            ("slice", builtins.slice(None)) if kind == "none" else (kind, v)
            for kind, v in entries
        ]
    if any(kind in ("array", "mask") for kind, _ in entries):
        return _advanced(x, entries)
    return _basic(x, entries)


def _basic(x, entries):
    for axis, (kind, v) in enumerate(entries):
        if kind == "int":
            _check_int(v, x.shape[axis], axis)
    as_slices = [
        ("slice", builtins.slice(v, v + 1 if v != -1 else None))
        if kind == "int"
        else (kind, v)
        for kind, v in entries
    ]
    x = _apply_slices(x, as_slices)
    # Tensor scalars: a gather of one row per axis (clamped, as JAX's
    # dynamic indexing), highest axis first so positions stay valid.
    scalars = [a for a, (kind, _) in enumerate(entries) if kind == "scalar"]
    for axis in reversed(scalars):
        x = _take_scalar(x, entries[axis][1], axis)
    drop = [a for a, (kind, _) in enumerate(entries) if kind == "int"]
    if drop:
        kept = [a for a, (kind, _) in enumerate(entries) if kind != "scalar"]
        shape = tuple(
            d for a, d in zip(kept, x.shape) if entries[a][0] != "int"
        )
        x = arrays._reshape(x, arrays._fill_unknown(shape))
    return x


def _take_scalar(x, index, axis):
    index = convert_to_tensor(index)
    front = arrays.moveaxis(x, axis, 0) if axis else x
    # The gather drops the front axis: the others keep their order.
    return ix.gather_p.bind(front, arrays._reshape(index, (1,)), mode="clip")


def _mask_to_indices(mask):
    if isinstance(mask, Tracer):
        raise IndexError(
            f"Indexing with a traced boolean mask {mask.aval.short()} gives "
            "an array whose size depends on the mask's values, which IPU "
            "programs cannot have. Use keras.ops.where(mask, x, 0) to keep "
            "the shape, or index eagerly."
        )
    mask = convert_to_tensor(mask)
    return list(dyn.nonzero_p.bind(mask, index_dtype=np.dtype("int32")))


def _advanced(x, entries):
    # A lone mask over the leading axes: one masked select.
    kinds = [k for k, _ in entries]
    if (
        kinds[0] == "mask"
        and all(
            k == "slice" and v == builtins.slice(None)
            for k, v in entries[1:]
        )
    ):
        mask = entries[0][1]
        if isinstance(mask, Tracer):
            _mask_to_indices(mask)
        mask = convert_to_tensor(mask)
        for axis, (m, d) in enumerate(zip(mask.shape, x.shape)):
            if d is not None and m != d:
                raise IndexError(
                    f"boolean index did not match indexed array along axis "
                    f"{axis}; size of axis is {d} but size of corresponding "
                    f"boolean axis is {m}"
                )
        return dyn.masked_select_p.bind(x, mask)
    # Masks become their nonzero index arrays (one per mask dim).
    flat = []
    for kind, v in entries:
        if kind == "mask":
            flat.extend(("array", i) for i in _mask_to_indices(v))
        else:
            flat.append((kind, v))
    entries = flat
    x = _apply_slices(x, entries)
    adv_kinds = ("array", "int", "scalar")
    adv_axes = [a for a, (k, _) in enumerate(entries) if k in adv_kinds]
    rest = [a for a in range(x.ndim) if a not in adv_axes]
    index_arrays = []
    for a in adv_axes:
        kind, v = entries[a]
        if kind == "int":
            _check_int(v, x.shape[a], a)
            v = np.asarray(v, dtype=np.int32)
        elif isinstance(v, np.ndarray) and x.shape[a] is not None:
            if v.size and (v.max() >= x.shape[a] or v.min() < -x.shape[a]):
                bad = v.max() if v.max() >= x.shape[a] else v.min()
                raise IndexError(
                    f"index {bad} is out of bounds for axis {a} with size "
                    f"{x.shape[a]}"
                )
        index_arrays.append(convert_to_tensor(v))
    dtype = np.result_type(*(np.dtype(i.dtype) for i in index_arrays))
    index_arrays = [arrays._cast(i, dtype) for i in index_arrays]
    try:
        bshape = shape_rules.broadcast_shapes(*(i.shape for i in index_arrays))
    except shape_rules.ShapeError:
        raise IndexError(
            "shape mismatch: indexing arrays could not be broadcast together "
            "with shapes " + " ".join(str(tuple(i.shape)) for i in index_arrays)
        ) from None
    index_arrays = [
        arrays._reshape(
            arrays._broadcast(i, bshape), arrays._fill_unknown(bshape + (1,))
        )
        for i in index_arrays
    ]
    indices = arrays._concat(index_arrays, len(bshape))
    front = arrays._transpose(x, adv_axes + rest)
    out = ix.gather_p.bind(front, indices, mode="clip")
    contiguous = adv_axes == list(range(adv_axes[0], adv_axes[0] + len(adv_axes)))
    if contiguous and adv_axes[0] > 0:
        # NumPy puts adjacent advanced indices' dims where they stood.
        nb, p = len(bshape), adv_axes[0]
        perm = list(range(nb, nb + p)) + list(range(nb)) + list(range(nb + p, out.ndim))
        out = arrays._transpose(out, perm)
    return out


# --------------------------------------------------------- keras.ops core


def _int_tensor(x):
    x = convert_to_tensor(x)
    if x.dtype.kind not in "iu":
        x = arrays._cast(x, "int32")
    return x


def scatter(indices, values, shape):
    values = convert_to_tensor(values)
    shape = tuple(arrays._static_ints(shape, "shape"))
    zeros = arrays._filled(shape, 0, values.dtype)
    return _scatter(zeros, indices, values, "add")


def _scatter(inputs, indices, updates, mode):
    indices = _int_tensor(indices)
    if indices.ndim == 1:
        indices = arrays._reshape(indices, (1, indices.shape[0]))
    k = indices.shape[-1]
    want = tuple(indices.shape[:-1]) + tuple(inputs.shape[k:])
    updates = arrays._cast(convert_to_tensor(updates), inputs.dtype)
    if tuple(updates.shape) != want:
        updates = arrays._broadcast(updates, want)
    return ix.scatter_p.bind(inputs, indices, updates, mode=mode)


_REDUCTIONS = {None: "update", "add": "add", "max": "max", "min": "min", "mul": "mul"}


def scatter_update(inputs, indices, updates, reduction=None):
    if reduction not in _REDUCTIONS:
        raise ValueError(
            f"Unsupported reduction: {reduction}. Use None, 'add', 'mul', "
            "'min' or 'max'."
        )
    inputs = convert_to_tensor(inputs)
    return _scatter(inputs, indices, updates, _REDUCTIONS[reduction])


def _starts(start_indices, ndim):
    """Start indices as a static tuple of ints when they are static Python
    or NumPy values; None when any is a tensor (then the starts are
    operands of a dynamic slice, clamped as in XLA)."""
    if isinstance(start_indices, (Tensor, Tracer)):
        return None
    if isinstance(start_indices, (list, tuple)):
        if any(isinstance(s, (Tensor, Tracer)) for s in start_indices):
            return None
        return tuple(int(np.asarray(s)) for s in start_indices)
    return tuple(int(s) for s in np.asarray(start_indices).reshape(-1))


def _start_scalars(start_indices, ndim):
    if isinstance(start_indices, (list, tuple)):
        parts = [_int_tensor(s) for s in start_indices]
        return [arrays._reshape(p, ()) if p.ndim else p for p in parts]
    s = _int_tensor(start_indices)
    return [getitem(s, i) for i in range(ndim)]


def _check_rank(inputs, n, what):
    if n != inputs.ndim:
        raise ValueError(
            f"The number of dimensions in `{what}` must match the number of "
            f"dimensions in `inputs`. Received {what} of length {n} and "
            f"inputs.shape={inputs.shape}"
        )


def slice(inputs, start_indices, shape):
    inputs = convert_to_tensor(inputs)
    shape = arrays._static_ints(shape, "shape")
    _check_rank(inputs, len(shape), "shape")
    starts = _starts(start_indices, inputs.ndim)
    if starts is not None:
        _check_rank(inputs, len(starts), "start_indices")
        sizes = []
        for d, s, n in zip(inputs.shape, starts, shape):
            if n == -1:
                sizes.append(None if d is None else d - s)
            else:
                sizes.append(n)
        if None in inputs.shape or None in sizes:
            # Unknown dims (tracing): a static slice keeps them symbolic.
            return ix.slice_p.bind(
                inputs,
                start_indices=starts,
                limit_indices=tuple(
                    None if n is None else s + n for s, n in zip(starts, sizes)
                ),
                strides=(1,) * inputs.ndim,
            )
        scalars = [np.asarray(s, np.int32) for s in starts]
    else:
        scalars = _start_scalars(start_indices, inputs.ndim)
        _check_rank(inputs, len(scalars), "start_indices")
        if -1 in shape:
            if any(isinstance(v, Tracer) for v in scalars):
                raise ValueError(
                    "keras.ops.slice: a shape entry of -1 needs start indices "
                    "known before tracing (the slice size depends on them); "
                    "got traced starts. Pass the size explicitly."
                )
            # Eager tensor starts: their values fix the output shape.
            shape = [
                d - int(s) if n == -1 else n
                for d, s, n in zip(inputs.shape, scalars, shape)
            ]
        sizes = list(shape)
    dtype = np.result_type(*(np.dtype(s.dtype) for s in scalars))
    scalars = [arrays._cast(convert_to_tensor(s), dtype) for s in scalars]
    return ix.dynamic_slice_p.bind(inputs, *scalars, slice_sizes=tuple(sizes))


def slice_update(inputs, start_indices, updates):
    inputs = convert_to_tensor(inputs)
    updates = arrays._cast(convert_to_tensor(updates), inputs.dtype)
    starts = _starts(start_indices, inputs.ndim)
    if starts is not None:
        scalars = [np.asarray(s, np.int32) for s in starts]
    else:
        scalars = _start_scalars(start_indices, inputs.ndim)
    _check_rank(inputs, len(scalars), "start_indices")
    if updates.ndim != inputs.ndim:
        raise ValueError(
            f"slice_update: `updates` {updates.shape} must have the rank of "
            f"`inputs` {inputs.shape}"
        )
    dtype = np.result_type(*(np.dtype(s.dtype) for s in scalars))
    scalars = [arrays._cast(convert_to_tensor(s), dtype) for s in scalars]
    return ix.dynamic_update_slice_p.bind(inputs, updates, *scalars)


def unstack(x, num=None, axis=0):
    x = convert_to_tensor(x)
    axis = arrays._axis(axis, x.ndim)
    n = x.shape[axis]
    if n is None:
        if num is None:
            raise ValueError(
                f"Cannot infer argument `num` from shape {x.shape}: axis "
                f"{axis} is unknown. Pass `num`."
            )
        n = num
    out_shape = arrays._fill_unknown(x.shape[:axis] + x.shape[axis + 1 :])
    return [
        arrays._reshape(arrays._slice_axis(x, axis, i, i + 1), out_shape)
        for i in range(n)
    ]
