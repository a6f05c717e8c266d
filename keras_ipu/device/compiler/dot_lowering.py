"""Lowering of dot_general with its plan fixed at compile time.

The eager kernel parses the dimension numbers, works out the transposes
and the batch-matmul shapes on every call; with static shapes all of that
is known when the program is lowered, so the compiled kernel is just
(cast) -> transpose -> reshape -> matmul -> reshape -> (cast), with the
no-op steps left out. Same computation as the kernel in
primitives/dot.py (including its float32 accumulation of half types).

Threads (native/threads.py): a product worth it is split into row (or
column, or batch) blocks, each a one-thread BLAS call on the host pool
(a 2-d float32 product on the C pool, product_pool.py); small products
stay on the caller's thread.
"""

import numpy as np

from keras_ipu.device.compiler.lowering import LOWERINGS
from keras_ipu.device.compiler.lowering import ORDERED_OUTPUT_LOWERINGS
from keras_ipu.device.native import product_pool
from keras_ipu.device.native import threads as host_threads
from keras_ipu.device.primitives.dot import compute_dtype
from keras_ipu.device.primitives.dot import split_dimensions


def _prod(dims):
    return int(np.prod(dims, dtype=np.int64))


def product_shape(params, lhs, rhs):
    """(b, m, n, k, compute dtype) of the matmul a dot_general of static
    operand avals lowers to: x (b, m, k) @ y (b, k, n), b = 0 for a 2-d
    product (no batch dimensions). concurrent_steps.py plans with it."""
    lc, _, lb, _, lf, rf = split_dimensions(lhs.ndim, rhs.ndim, params["dimension_numbers"])
    compute, _ = compute_dtype(lhs.dtype, params.get("preferred_element_type"))
    b = _prod([lhs.shape[d] for d in lb]) if lb else 0
    m = _prod([lhs.shape[d] for d in lf])
    n = _prod([rhs.shape[d] for d in rf])
    k = _prod([lhs.shape[d] for d in lc])
    return b, m, n, k, compute


def _lower_dot_general(params, in_avals, out_avals):
    lhs, rhs = in_avals
    lc, rc, lb, rb, lf, rf = split_dimensions(lhs.ndim, rhs.ndim, params["dimension_numbers"])
    compute, out_dtype = compute_dtype(lhs.dtype, params.get("preferred_element_type"))
    lperm, rperm = lb + lf + lc, rb + rc + rf
    b, m, n, k, _ = product_shape(params, lhs, rhs)
    out_shape = out_avals[0].shape
    batched = bool(lb)
    lshape = (b, m, k) if batched else (m, k)
    rshape = (b, k, n) if batched else (k, n)
    layout = (lhs, rhs, lperm, rperm, lshape, rshape, out_shape, compute, out_dtype)
    split = host_threads.matmul_plan(b, m, n, k, compute)
    # The whole product on one thread, with its splits' bits: our float32
    # kernel where the C pool's blocks run it (product_pool.native_gemm).
    whole = product_pool.whole_matmul(compute)
    if len(lb) > 1 and min(m, n, k) > 1:
        batch_shape = tuple(lhs.shape[d] for d in lb)
        nd_split = None if split is None else host_threads.batched_matmul_plan(
            batch_shape, m, n, k, compute)
        if split is None or nd_split is not None:
            return _batched_kernel(nd_split, whole, batch_shape, *layout,
                                   order=params.get("output_order"))
    if split is None:
        kernel = _kernel(whole, *layout)
    else:
        kernel = _kernel(split, *layout)
        # A split with one thread's bits (the C pool's) also has the product on
        # one thread: a launched job runs that one (concurrent_steps.py).
        alone = getattr(split, "one_thread", None)
        if alone is not None:
            kernel.one_thread = _kernel(alone, *layout)
    if not batched and (split is None or hasattr(kernel, "one_thread")):
        # The matmul's operands (views) of a product that is one whole call
        # on one thread: a job on the C pool computes it in C with the same
        # call (concurrent_steps._product_start, _c_pool_start).
        operands = _plain_product(_operands, lhs, rhs, lperm, rperm,
                                  lperm != tuple(range(lhs.ndim)),
                                  rperm != tuple(range(rhs.ndim)), lshape, rshape, out_shape)
        if (operands is not None and lhs.dtype == rhs.dtype == compute
                and np.dtype(compute) == out_dtype):
            kernel.operands = operands
            kernel.result_shape = (tuple(out_shape), np.dtype(out_dtype))
    return kernel


def _batched_kernel(split, whole, batch_shape, lhs, rhs, lperm, rperm, lshape, rshape,
                    out_shape, compute, out_dtype, order=None):
    """The kernel of a product batched over several axes, as np.matmul on
    the operands' views with their batch axes kept: flattened to one, the
    batches of a transposed operand share no one stride, and the reshape
    copies it (attention's products: queries and keys (B, S, H, D) read per
    (B, H), the probabilities' transpose (8 MB) read by the key gradient),
    a copy on the caller's thread even where the product then splits.
    np.matmul calls the same gemm per batch on the views (the same bits).
    `split` (threads.batched_matmul_plan) runs it on several threads,
    `whole` (product_pool.whole_matmul) on one.
    `order`: the permutation of the transpose that alone reads the result
    (the Executable's output_order), whose layout the result then takes
    (_ordered_result)."""
    m, k = lshape[-2:]
    n = rshape[-1]
    lnd, rnd = (*batch_shape, m, k), (*batch_shape, k, n)
    ordered = None
    if order is not None and lhs.dtype == rhs.dtype == compute == out_dtype:
        ordered = _ordered_result(order, out_shape, (*batch_shape, m, n), out_dtype)
    if ordered is not None:
        kernel = _ordered_kernel(_blas_ready(split or whole), lperm, rperm, lnd, rnd,
                                 *ordered)
        if split is not None:
            kernel.one_thread = _ordered_kernel(_blas_ready(whole), lperm, rperm, lnd,
                                                rnd, *ordered)
        return kernel
    kernel = _kernel(_blas_ready(split or whole), lhs, rhs, lperm, rperm, lnd, rnd,
                     out_shape, compute, out_dtype)
    if split is not None:
        kernel.one_thread = _kernel(_blas_ready(whole), lhs, rhs, lperm, rperm, lnd, rnd,
                                    out_shape, compute, out_dtype)
    return kernel


def _ordered_result(order, out_shape, matmul_shape, dtype):
    """(stored shape, inverse permutation, matmul_shape) of a result laid
    out in memory as its transpose by `order` lies, or None where np.matmul
    could not write its matrices there through gemm. Attention's outputs
    are transposed back to (B, S, H, D) and reshaped for the next
    projection, whose product (and bias-gradient sum) copied the strided
    view (2 MB, three per step); written in that layout, the transpose is
    C-contiguous. gemm writes each matrix as it would into a contiguous
    result (its rows a stride apart: ldc), so the bits are the same."""
    order = tuple(order)
    stored = tuple(out_shape[a] for a in order)
    inverse = tuple(int(a) for a in np.argsort(order))
    if order == tuple(range(len(order))):
        return None
    probe = np.empty(stored, dtype).transpose(inverse)
    view = probe.reshape(matmul_shape)
    if not np.shares_memory(view, probe):  # the reshape would copy
        return None
    size = view.itemsize
    rows, cols = view.strides[-2:]
    # gemm's C: unit stride along a row, rows a whole row apart (NumPy's
    # is_blasable2d for matmul's output); otherwise its own loop: other bits.
    if cols != size or rows % size or rows < matmul_shape[-1] * size:
        return None
    return stored, inverse, tuple(matmul_shape)


def _ordered_kernel(matmul, lperm, rperm, lnd, rnd, stored, inverse, matmul_shape):
    """The batched product writing its result into a new array laid out in
    the stored order (a view of it in the result's shape)."""
    transpose_l = lperm != tuple(range(len(lperm)))
    transpose_r = rperm != tuple(range(len(rperm)))
    empty = np.empty

    def dot_general(x, y):
        if transpose_l:
            x = x.transpose(lperm)
        if transpose_r:
            y = y.transpose(rperm)
        out = empty(stored, x.dtype).transpose(inverse)
        matmul(x.reshape(lnd), y.reshape(rnd), out=out.reshape(matmul_shape))
        return out

    return dot_general


def _blas_ready(matmul):
    """`matmul` of operands whose matrices BLAS reads as laid out (one unit
    stride, the other a whole row or column apart): np.matmul would compute
    any other view in its own loop, not in gemm (slower, and other bits),
    so such an operand is copied first, as the flattening reshape did."""
    ascontiguous = np.ascontiguousarray

    def ready(a):
        size = a.itemsize
        rows, cols = a.strides[-2:]
        if ((cols == size and rows % size == 0 and rows >= a.shape[-1] * size)
                or (rows == size and cols % size == 0 and cols >= a.shape[-2] * size)):
            return a
        return ascontiguous(a)

    def blas_matmul(x, y, out=None):
        return matmul(ready(x), ready(y), out=out)

    return blas_matmul


def _row_axes(shape, rows):
    """How many leading axes of `shape` hold `rows` elements."""
    size = 1
    for axis, extent in enumerate(shape):
        if size == rows:
            return axis
        size *= extent
    return len(shape)


def _matrix(a, row_axes, shape):
    """The 2-d `shape` matrix of the transposed operand `a` (its first
    `row_axes` axes the rows) for a product above OpenBLAS' small-matrix
    bound. Its reshape is a view where each group of axes lies evenly in
    memory; otherwise it copies in the matrix's row-major order, which for
    an operand laid out column-major (the LSTM's time-major view of the
    embedding's (batch, time, features) result, contracted over time and
    batch for the embedding kernel's gradient) gathers one element per
    8 KiB: 0.9 ms for 1 MiB on the AMD host, a third of the product's
    time. Such an operand is copied in its own order (the columns' axes
    first: whole 64-float rows there) and handed to np.matmul transposed,
    which BLAS reads as laid out (_blas_ready), summing the same products
    in the same order: the same bits (issue 16, seventeenth pass, s17lstm:
    rows 16-256 by 4096-long sums checked, and blocked kernels pack either
    layout into the same panels)."""
    axes = list(zip(a.shape, a.strides))
    row_part = [(n, st) for n, st in axes[:row_axes] if n != 1]
    col_part = [(n, st) for n, st in axes[row_axes:] if n != 1]
    if (row_part and col_part and not (_even(row_part) and _even(col_part))
            and col_part[-1][1] != a.itemsize and row_part[-1][1] == a.itemsize):
        order = (*range(row_axes, a.ndim), *range(row_axes))
        return np.ascontiguousarray(a.transpose(order)).reshape(shape[::-1]).T
    return a.reshape(shape)


def _even(axes):
    """Whether (extent, stride) pairs, outermost first, merge into one
    axis: each stride the next one's times its extent."""
    return all(outer[1] == inner[1] * inner[0] for outer, inner in zip(axes, axes[1:]))


def _operands(x, y):
    return x, y


def _kernel(matmul, lhs, rhs, lperm, rperm, lshape, rshape, out_shape, compute, out_dtype):
    """The product's kernel with `matmul` computing x (b, m, k) @ y (b, k, n)."""
    cast_l = lhs.dtype != compute
    cast_r = rhs.dtype != compute
    cast_out = np.dtype(compute) != out_dtype
    transpose_l = lperm != tuple(range(lhs.ndim))
    transpose_r = rperm != tuple(range(rhs.ndim))
    transpose = np.transpose

    if not (cast_l or cast_r or cast_out):
        plain = _plain_product(matmul, lhs, rhs, lperm, rperm, transpose_l, transpose_r,
                               lshape, rshape, out_shape)
        if plain is not None:
            return plain

    matrices = None
    if len(lshape) == 2 and _prod(lshape) * rshape[-1] > product_pool.SMALL_MATRIX_MNK:
        # How many of each transposed operand's axes make its matrix's rows.
        matrices = (_row_axes([lhs.shape[d] for d in lperm], lshape[0]),
                    _row_axes([rhs.shape[d] for d in rperm], rshape[0]))

    def dot_general(x, y):
        if cast_l:
            x = x.astype(compute)
        if cast_r:
            y = y.astype(compute)
        if transpose_l:
            x = transpose(x, lperm)
        if transpose_r:
            y = transpose(y, rperm)
        if matrices is None:
            out = matmul(x.reshape(lshape), y.reshape(rshape))
        else:
            out = matmul(_matrix(x, matrices[0], lshape), _matrix(y, matrices[1], rshape))
        out = out.reshape(out_shape)
        return out.astype(out_dtype) if cast_out else out

    return dot_general


def _plain_product(matmul, lhs, rhs, lperm, rperm, transpose_l, transpose_r,
                   lshape, rshape, out_shape):
    """The kernel of a product needing no cast whose operands, transposed,
    and result already have the matmul's shapes (most of a training
    step's): no reshape, and each transpose the array's own method (a view;
    np.transpose adds NumPy's Python wrapper). The same matmul of the same
    operands, 0.5-0.9 us less Python per call (issue 16, eighth pass: per
    product of a step, per time step of a scan's body). None otherwise."""
    transposed = tuple(lhs.shape[d] for d in lperm), tuple(rhs.shape[d] for d in rperm)
    if transposed != (lshape, rshape) or tuple(out_shape) != (*lshape[:-1], rshape[-1]):
        return None
    if transpose_l and transpose_r:
        def dot_general(x, y):
            return matmul(x.transpose(lperm), y.transpose(rperm))
    elif transpose_l:
        def dot_general(x, y):
            return matmul(x.transpose(lperm), y)
    elif transpose_r:
        def dot_general(x, y):
            return matmul(x, y.transpose(rperm))
    else:
        def dot_general(x, y):
            return matmul(x, y)
    return dot_general


LOWERINGS["dot_general"] = _lower_dot_general
ORDERED_OUTPUT_LOWERINGS.add("dot_general")
