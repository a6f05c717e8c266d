"""Float sums and maxima along the last axis in one C call (native/_rows.c).

NumPy's reduction over the last axis of a C-contiguous array calls its
inner loop once per row; for the short rows of attention's scores and a
layer norm's statistics (64 elements in the benchmark transformer: its
softmax's row maxima and sums, eleven layer-norm sums per step) that call
costs more than the work. The C kernels run every row in one call, with
NumPy's bits: the sum is NumPy's pairwise summation from +0.0, the maximum
one value whatever the order (the rows where it is not, a NaN or a
maximum of zero whose sign the order picks, are left to NumPy).
128x4x64x64 -> 128x4x64: sum 1.90 -> 0.33 ms; 128x64x64 -> 128x64: sum
0.31 -> 0.09 ms (one thread, minimum of 30 calls; benchmarks/README.md,
issue 16 fourteenth pass). Split over rows by the Python pool
(leading_axis.split_rows, as NumPy's reductions are) the 8 MB sum took
0.40 ms against 0.21 whole, the maximum no less (minimum of 60 calls at 2
threads, load 10): its helper, a Python thread, takes the GIL to claim its
rows. They split in row tasks on the C pool instead (_rows.c, the same bits
at any split), sized as the fused chains are (threads.chain_threads), but
only where a second thread adds memory bandwidth (threads.streaming_scales:
not this project's 2-core VM): the sum reads at the memory's speed (0.2 ms
for the 8 MB of the softmax's scores), and the maximum, in SSE2 registers,
at about half of it (0.40 ms, from 1.07 in GCC's scalar code; issue 16,
fifteenth pass).

Above one pairwise block (128 elements) NumPy adds two halves, and which
of two NaNs of opposite signs (NaN and inf - inf's) survives their add
depends on the compiled operand order: a row summing to NaN there is
summed again by NumPy.
"""

import numpy as np

from keras_ipu.device import native
from keras_ipu.device.native import product_pool
from keras_ipu.device.native import threads as host_threads

# NumPy's PW_BLOCKSIZE: rows up to this long are one block of 8 accumulators.
_PAIRWISE_BLOCK = 128


def _last_axis(x_aval, axes):
    """The length of x_aval's last axis when `axes` is that axis alone, of
    a static float32/float64 array of at least 2 dimensions; else None."""
    if native.rows is None or x_aval.dtype not in native.FLOAT_DTYPES or not x_aval.is_static():
        return None
    ndim = x_aval.ndim
    if ndim < 2 or tuple(a % ndim for a in axes) != (ndim - 1,):
        return None
    n = int(x_aval.shape[-1])
    return n if n >= 1 else None


def row_split(x_aval, streaming=True):
    """(threads, rows per task, tasks) of a C row reduction over
    `x_aval`'s last axis on the C pool, or None (whole on the caller's
    thread): as the C chains split (threads.chain_threads), two tasks per
    thread so that a helper that comes late leaves its rows to the caller;
    `streaming`: it reads at the memory's speed, and splits only where a
    second thread adds bandwidth (both reductions here)."""
    if not getattr(native.rows, "SPLITS", 0) or not product_pool.tasks_available():
        return None
    size = int(np.prod(x_aval.shape, dtype=np.int64))
    rows = size // int(x_aval.shape[-1])
    threads = min(host_threads.chain_threads(size), rows)
    if threads <= 1 or (streaming and not host_threads.streaming_scales()):
        return None
    per_task = -(-rows // (threads * host_threads.BLOCKS_PER_THREAD))
    return threads, per_task, -(-rows // per_task)


def _in_row_tasks(call, x_aval, lead=0):
    """`call` (sum_last, max_last), in row tasks on the C pool where
    row_split says (threads.split_kernel): then it returns its `lead`
    results before the split's stats in a tuple, or its whole call's while
    backing off."""
    split = row_split(x_aval, streaming=True)
    if split is None:
        return call, ""
    threads, per_task, count = split
    return host_threads.split_kernel(call, threads, count, per_task, lead=lead), "_split"


def last_axis_sum_kernel(x_aval, axes):
    """The C kernel of a float sum of `x_aval` over its last axis alone, or
    None (the caller keeps NumPy's reduction). It falls back to NumPy for
    an operand the C kernel cannot read (not C-contiguous)."""
    n = _last_axis(x_aval, axes)
    if n is None:
        return None
    dtype = x_aval.dtype
    reduce, empty, isnan = np.add.reduce, np.empty, np.isnan
    halves = n > _PAIRWISE_BLOCK
    sum_last, split = _in_row_tasks(native.rows.sum_last, x_aval)

    def sum_last_axis(x):
        out = empty(x.shape[:-1], dtype)
        # False: a buffer did not fit (a split's stats are a tuple, true).
        # A row summing to NaN over halves: NumPy's NaN is summed again.
        if sum_last(x, out, n) and not (halves and isnan(out).any()):
            return out
        return reduce(x, axis=-1)

    sum_last_axis.__name__ += split
    sum_last_axis.splits_itself = True  # leading_axis.split_kernel leaves it
    return sum_last_axis


def last_axis_max_kernel(x_aval, axes):
    """The C kernel of a float maximum of `x_aval` over its last axis
    alone, or None; NumPy's reduction where it leaves a row undecided or
    cannot read the operand."""
    n = _last_axis(x_aval, axes)
    if n is None:
        return None
    dtype = x_aval.dtype
    reduce, empty = np.maximum.reduce, np.empty
    max_last, split = _in_row_tasks(native.rows.max_last, x_aval, lead=1)

    def max_last_axis(x):
        out = empty(x.shape[:-1], dtype)
        # The rows it left undecided (a NaN, a maximum of zero; -1: a buffer
        # did not fit), first in a split's tuple.
        done = max_last(x, out, n)
        if (done[0] if type(done) is tuple else done) == 0:
            return out
        return reduce(x, axis=-1)

    max_last_axis.__name__ += split
    max_last_axis.splits_itself = True
    return max_last_axis
