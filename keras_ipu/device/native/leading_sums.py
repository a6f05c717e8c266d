"""Float32 sums over an array's leading axes in one C pass.

A sum over the leading axes (BatchNormalization's batch statistics and
their gradients, a bias gradient: every axis but the channels) is the
rows of the array seen as (rows, columns) added up. NumPy adds them in
row order from +0.0, as `_elementwise.sum_rows` does, so both give the same
bits; but NumPy calls its inner loop once per row, which for a few dozen
columns costs more than the adds: 128x32x32x32 -> 32 took 28.7 ms in
NumPy and 1.8 ms in C (minimum of 20 calls, this 2-core machine at load
13; 128x16x16x64 -> 64: 1.11 against 0.28 ms). A large sum with enough
columns splits into column blocks on the C pool (threads.sum_split: the
same bits); a narrower one is split by rows over the Python pool
(leading_axis.split_sum, this kernel for each part) where a second thread
adds memory bandwidth. Not on this project's 2-core VM: there the
transformer's ten bias and layer-norm gradient sums per step (0.1-0.4 ms
each) split in four row blocks on the Python pool, whose helper (a
Python thread) came late to many of them, and each late split counted
towards the back-off that ran the whole step on one thread (issue 16,
fifteenth pass, s15xformer).

A sum too narrow for column blocks (SUM_TASK_COLUMNS: BatchNormalization's
32 channels over 131072 rows, six per step of the benchmark CNN) splits
by rows on the C pool where bandwidth scales (row_split): each task adds
its block of rows in order into a partial sum, and the partials are added
in block order (the same order as leading_axis.split_sum's, in one C call
and without a Python thread per block). Its bits then depend on the
number of blocks, as the Python split's did. The blocks therefore follow
from the sum's size and the thread cap alone: where bandwidth does not
scale (a probe of about 20 ms, threads.streaming_scales, whose answer
varied between runs of the transformer on the 2-core VM: its loss after
one epoch took one of two values at two threads, issue 16, twenty-third
pass, s23det), the same blocks run on the caller's thread alone, as while
backing off. On a 16-core host the Python
split of the 32-column sum ran 1.16 / 0.85 / 0.78 / 1.01 / 1.59 ms at 1 /
2 / 4 / 8 / 16 threads (issue 16, sixteenth pass): slower from 8 threads
on, its blocks each a Python call under the interpreter lock.
"""

import numpy as np

from keras_ipu.device import native
from keras_ipu.device.native import product_pool
from keras_ipu.device.native import threads as host_threads

_F32 = np.dtype(np.float32)


def leading_sum_kernel(x_aval, axes):
    """The C kernel of a float32 sum of `x_aval` over `axes`, when they are
    its leading axes (0 .. k-1, not all of them); None otherwise (the
    caller keeps NumPy's reduction). It falls back to NumPy for an operand
    the C kernel cannot read (not C-contiguous)."""
    # An extension built before sum_rows existed (an editable install not
    # rebuilt after an update) still serves its other kernels: NumPy here.
    sum_rows = getattr(native.elementwise, "sum_rows", None)
    if sum_rows is None or x_aval.dtype != _F32 or not x_aval.is_static():
        return None
    ndim = x_aval.ndim
    axes = tuple(sorted(a % ndim for a in axes)) if ndim else ()
    if not axes or axes != tuple(range(len(axes))) or len(axes) >= ndim:
        return None
    out_shape = tuple(x_aval.shape[len(axes):])
    cols = int(np.prod(out_shape, dtype=np.int64))
    if cols == 0:
        return None
    reduce, empty = np.add.reduce, np.empty
    rows = int(np.prod(x_aval.shape[:len(axes)], dtype=np.int64))
    threads, width = host_threads.sum_split(rows, cols)
    # Column blocks where bandwidth scales, else the whole sum here: NumPy's
    # bits either way, so never row blocks (their bits would then follow
    # threads.streaming_scales, a timing probe).
    by_columns = host_threads.sum_column_threads(rows, cols) > 1
    if threads == 1 and not by_columns:
        by_rows = row_split(rows, cols)
        if by_rows is not None:
            return _row_block_sum(sum_rows, out_shape, axes, rows, cols, *by_rows)
    if threads > 1:
        # Column blocks on the C pool: NumPy's bits at any thread count.
        run = host_threads.split_kernel(sum_rows, threads, -(-cols // width), width)

        def sum_leading_axes_split(x):
            out = empty(out_shape, _F32)
            done = run(x, out, rows, cols)
            return out if done is not False else reduce(x, axis=axes)

        sum_leading_axes_split.splits_itself = True  # leading_axis.split_kernel leaves it
        return sum_leading_axes_split

    def sum_leading_axes(x):
        # Rows from the operand: leading_axis.split_sum passes row blocks.
        out = empty(out_shape, _F32)
        if x.size and sum_rows(x, out, x.size // cols, cols):
            return out
        return reduce(x, axis=axes)

    if by_columns:
        sum_leading_axes.splits_itself = True  # leading_axis.split_sum leaves it
    else:
        # At memory speed, as a copy: leading_axis.split_sum splits its rows
        # over threads only where a second thread adds bandwidth
        # (threads.streaming_scales).
        sum_leading_axes.streams = True
    return sum_leading_axes


def row_split(rows, cols):
    """(threads, rows per task) of a float32 sum of `rows` x `cols` in row
    blocks (module doc), two tasks per thread: where the column blocks
    (threads.sum_split) cannot split it and the C kernel takes row blocks
    (an extension built before them does not); None otherwise. `threads`
    is 1 where a second thread adds no memory bandwidth
    (threads.streaming_scales; this project's 2-core VM): the same blocks,
    so the same bits, on the caller's thread."""
    if (not getattr(native.elementwise, "SUM_ROW_BLOCKS", 0)
            or not product_pool.tasks_available()):
        return None
    threads = min(host_threads.chain_threads(rows * cols), rows)
    if threads <= 1:
        return None
    block_rows = -(-rows // (threads * host_threads.BLOCKS_PER_THREAD))
    return (threads if host_threads.streaming_scales() else 1), block_rows


def _row_block_sum(sum_rows, out_shape, axes, rows, cols, threads, block_rows):
    blocks = -(-rows // block_rows)
    reduce, empty = np.add.reduce, np.empty
    # While backing off, or where bandwidth does not scale (threads 1), the
    # same row blocks on the caller's thread alone: the partials, so the
    # bits, depend on the blocks.
    def whole(*args):
        return sum_rows(*args, 1, 0, block_rows)

    run = (host_threads.split_kernel(sum_rows, threads, blocks, 0, block_rows, whole=whole)
           if threads > 1 else whole)

    def sum_leading_axes_in_row_blocks(x):
        partials = empty((blocks, cols), _F32)
        if run(x, partials, rows, cols) is False:
            return reduce(x, axis=axes)
        out = empty(out_shape, _F32)
        sum_rows(partials, out, blocks, cols)  # the partials in block order
        return out

    sum_leading_axes_in_row_blocks.splits_itself = True  # leading_axis leaves it
    return sum_leading_axes_in_row_blocks
