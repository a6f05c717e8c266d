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
issue 16 fourteenth pass). They run whole on the caller's thread: split
over rows by the Python pool (leading_axis.split_rows, as NumPy's
reductions are) the 8 MB sum took 0.40 ms against 0.21 whole, the maximum
no less (minimum of 60 calls at 2 threads, load 10); the second core is
worth more to the kernels running beside them.

Above one pairwise block (128 elements) NumPy adds two halves, and which
of two NaNs of opposite signs (NaN and inf - inf's) survives their add
depends on the compiled operand order: a row summing to NaN there is
summed again by NumPy.
"""

import numpy as np

from keras_ipu.device import native

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


def last_axis_sum_kernel(x_aval, axes):
    """The C kernel of a float sum of `x_aval` over its last axis alone, or
    None (the caller keeps NumPy's reduction). It falls back to NumPy for
    an operand the C kernel cannot read (not C-contiguous)."""
    n = _last_axis(x_aval, axes)
    if n is None:
        return None
    sum_last, dtype = native.rows.sum_last, x_aval.dtype
    reduce, empty, isnan = np.add.reduce, np.empty, np.isnan
    halves = n > _PAIRWISE_BLOCK

    def sum_last_axis(x):
        out = empty(x.shape[:-1], dtype)
        if sum_last(x, out, n) and not (halves and isnan(out).any()):
            return out
        return reduce(x, axis=-1)

    sum_last_axis.splits_itself = True  # whole: leading_axis.split_kernel leaves it
    return sum_last_axis


def last_axis_max_kernel(x_aval, axes):
    """The C kernel of a float maximum of `x_aval` over its last axis
    alone, or None; NumPy's reduction where it leaves a row undecided or
    cannot read the operand."""
    n = _last_axis(x_aval, axes)
    if n is None:
        return None
    max_last, dtype = native.rows.max_last, x_aval.dtype
    reduce, empty = np.maximum.reduce, np.empty

    def max_last_axis(x):
        out = empty(x.shape[:-1], dtype)
        if max_last(x, out, n) == 0:
            return out
        return reduce(x, axis=-1)

    max_last_axis.splits_itself = True
    return max_last_axis
