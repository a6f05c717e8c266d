"""Lowerings of reshape, slice and of float reductions with their params bound.

reshape becomes the ndarray method call with the (static) output shape;
slice indexes with the eager kernel's key, built once (a view: an LSTM's
four gates cut from one product, every time step of its scan);
float sum/prod/max/min reductions call the ufunc's `reduce` directly (what
np.sum & co. do after their argument handling), with a 0-d result turned
back into an ndarray. Other dtypes keep the eager kernel, which also fixes
the result dtype of integer sums. A float32 sum over leading axes runs
in C (native/leading_sums.py), and a float sum or maximum along the last
axis (native/last_axis_reductions.py), all with NumPy's bits.
"""

import numpy as np

from keras_ipu.device import native
from keras_ipu.device.compiler.lowering import LOWERINGS
from keras_ipu.device.native.last_axis_reductions import last_axis_max_kernel
from keras_ipu.device.native.last_axis_reductions import last_axis_sum_kernel
from keras_ipu.device.native.leading_sums import leading_sum_kernel
from keras_ipu.device.primitives.indexing import scatter_p
from keras_ipu.device.primitives.reduce import reduce_max_p
from keras_ipu.device.primitives.reduce import reduce_min_p
from keras_ipu.device.primitives.reduce import reduce_prod_p
from keras_ipu.device.primitives.reduce import reduce_sum_p

_FLOATS = frozenset(np.dtype(t) for t in (np.float16, np.float32, np.float64))


def _lower_reshape(params, in_avals, out_avals):
    shape = out_avals[0].shape

    def reshape(x):
        return x.reshape(shape)

    return reshape


def _lower_slice(params, in_avals, out_avals):
    key = tuple(slice(s, l, st) for s, l, st in
                zip(params["start_indices"], params["limit_indices"], params["strides"]))
    if not key:
        return lambda x: x  # x[()] of a 0-d array would be a NumPy scalar

    def slice_(x):
        return x[key]

    return slice_


def _reduction(ufunc, primitive):
    def build(params, in_avals, out_avals):
        (x,), (out,) = in_avals, out_avals
        axes = tuple(params["axes"]) if params["axes"] is not None else None
        if x.dtype not in _FLOATS or out.dtype != x.dtype:
            kernel = primitive.kernel

            def generic(v):
                return np.asarray(kernel(v, axes=params["axes"]))

            return generic
        reduce = ufunc.reduce
        if out.ndim == 0:
            asarray = np.asarray

            def reduce_to_scalar(v):
                return asarray(reduce(v, axis=axes))

            return reduce_to_scalar

        if ufunc is np.add and axes is not None:
            native_sum = leading_sum_kernel(x, axes) or last_axis_sum_kernel(x, axes)
            if native_sum is not None:
                return native_sum
        if ufunc is np.maximum and axes is not None:
            native_max = last_axis_max_kernel(x, axes)
            if native_max is not None:
                return native_max

        def reduce_axes(v):
            return reduce(v, axis=axes)

        return reduce_axes

    return build


def _lower_scatter(params, in_avals, out_avals):
    """scatter-add of whole rows (the gradient of an embedding lookup).

    np.add.at, the eager kernel's tool, handles one index at a time. The C
    kernel (native/_scatter_add.c) adds the rows in add.at's order in one
    pass. Without it (or for float16, or buffers it does not take) the
    updates are grouped by their rank among the updates of the same row
    (first, second, ... occurrence): each group addresses distinct rows, so
    one vectorised `out[rows] += values` per group adds them in the same
    order as add.at, with the same result bit for bit. Groups: the largest
    number of updates of one row (a few dozen for an embedding), each a
    NumPy pass: 57-65 ms of the benchmark transformer's step on 16 cores.
    """
    x, indices, updates = in_avals
    kernel = scatter_p.kernel
    if (
        params["mode"] != "add"
        or params.get("batch_dims", 0) != 0
        or indices.shape[-1] != 1
        or x.dtype not in _FLOATS
        or x.ndim < 1
        or not x.is_static()
    ):
        def generic(*operands):
            return kernel(*operands, **params)

        return generic
    n_rows, row_shape = x.shape[0], tuple(x.shape[1:])
    row_len = int(np.prod(row_shape, dtype=np.int64))
    native_rows = native.scatter_add.rows if native.scatter_add is not None else None

    def scatter_add_rows(operand, index, update):
        if native_rows is not None:
            out = np.array(operand, copy=True, order="C")
            # False: a buffer the C loop does not take (float16, strides).
            if native_rows(out, np.ascontiguousarray(index),
                           np.ascontiguousarray(update), n_rows, row_len):
                return out
        return _scatter_add_numpy(operand, index, update)

    def _scatter_add_numpy(operand, index, update):
        rows = index.reshape(-1).astype(np.int64)
        update = update.reshape((-1,) + row_shape)
        rows = np.where(rows < 0, rows + n_rows, rows)
        valid = (rows >= 0) & (rows < n_rows)
        if not valid.all():  # out-of-range rows are dropped, as in XLA
            rows, update = rows[valid], update[valid]
        out = np.array(operand, copy=True)
        if rows.size == 0:
            return out
        order = np.argsort(rows, kind="stable")
        rows, update = rows[order], update[order]
        first = np.r_[True, rows[1:] != rows[:-1]]
        starts = np.flatnonzero(first)
        rank = np.arange(rows.size) - starts[np.cumsum(first) - 1]
        by_rank = np.argsort(rank, kind="stable")
        bounds = np.r_[0, np.cumsum(np.bincount(rank))]
        for lo, hi in zip(bounds[:-1], bounds[1:]):
            pick = by_rank[lo:hi]
            out[rows[pick]] += update[pick]
        return out

    return scatter_add_rows


LOWERINGS["reshape"] = _lower_reshape
LOWERINGS["slice"] = _lower_slice
LOWERINGS["scatter"] = _lower_scatter
LOWERINGS["reduce_sum"] = _reduction(np.add, reduce_sum_p)
LOWERINGS["reduce_prod"] = _reduction(np.multiply, reduce_prod_p)
LOWERINGS["reduce_max"] = _reduction(np.maximum, reduce_max_p)
LOWERINGS["reduce_min"] = _reduction(np.minimum, reduce_min_p)
