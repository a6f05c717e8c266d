"""Memory-bound kernels split over their leading axis on the host threads.

The products, the convolutions and the fused elementwise chains already
run on the threads their size is worth (threads.py). The rest of a CNN's
step stayed on one thread: the pads and adds of max pooling's gradient,
BatchNormalization's sums, the pooling itself and plain broadcast adds:
108 of the CNN's 235 ms per step on 16 cores (issue 16, third pass).
Each of these computes the rows of its result along axis 0 (the batch)
from the same rows of its operand, so a thread can compute rows
[lo, hi) on its own. Sums over axis 0 are the exception: each thread sums
its rows, and the partial sums are added in row order (a different
summation order from NumPy's one pass, as the split products have).

Same policy as the fused chains: a kernel splits from
threads.ELEMENTS_PER_THREAD elements per thread (memory-bound work, so far
fewer operations per thread than a product's FLOPS_PER_THREAD), under
the same caps; below that, or with a cap of 1, the kernel is returned as
it was. Pads and plain elementwise ops only stream memory (one read, one
write per element): they split only on a host where a second thread adds
memory bandwidth (threads.streaming_scales; not this project's 2-core
VM). NumPy's sums over leading axes and its pooling run far below the
memory's speed, so they split wherever their size is worth it; the C sum
over leading axes (leading_sums.py, `streams`) runs at the memory's
speed and splits over threads as the streaming kernels do, its row
blocks on the caller elsewhere (a sum's bits depend on its blocks, which
must not follow a timing probe). Every split kernel returns a new array (never a view of an
operand), as donation.py's `fresh_outputs` assumes of ufunc results.
"""

import numpy as np

from keras_ipu.device import native
from keras_ipu.device.native import threads as host_threads


def _static(avals):
    return all(a.is_static() for a in avals)


# The most threads of the Python pool a streaming kernel splits over. Its
# blocks each cost a Python call and a hand-off under the interpreter
# lock, and the memory's bandwidth stops growing after a few threads: on
# a 16-core Xeon (issue 16, sixteenth pass: the lead's host_threads.py
# run, wall ms median at 1 / 2 / 4 / 8 / 16 threads) the CNN's bias add
# 128x32x32x32 ran 4.89 / 2.95 / 1.91 / 2.03 / 2.69, its pad 2.61 / 1.46
# / 1.15 / 1.20 / 1.56, the BN sum on this pool 1.16 / 0.85 / 0.78 / 1.01
# / 1.59: fastest at 4, slower from 8 on. (A host where bandwidth does
# not scale, as this project's 2-core VM, never splits them.)
STREAMING_MAX_THREADS = 4


def _plan(out_aval, size=None, streaming=False, blocks_anyway=False):
    """(threads, row blocks) for a kernel over `size` elements (the
    output's by default) with `out_aval.shape[0]` rows; None: one thread.
    `streaming`: one read and one write per element, which splits only
    where a second thread adds memory bandwidth (threads.streaming_scales),
    over at most STREAMING_MAX_THREADS. `blocks_anyway` (a sum, whose bits
    depend on its blocks): elsewhere the same blocks on one thread, so that
    a timing probe never changes the bits."""
    shape = tuple(out_aval.shape)
    if not shape or shape[0] < 2:
        return None
    if size is None:
        size = int(np.prod(shape, dtype=np.int64))
    threads = min(host_threads.threads_for_elements(size), shape[0])
    if streaming:
        threads = min(threads, STREAMING_MAX_THREADS)
    if threads <= 1:
        return None
    blocks = host_threads.ranges(shape[0], 1, threads)
    if streaming and not host_threads.streaming_scales():
        return (1, blocks) if blocks_anyway else None
    return threads, blocks


def _run_rows(part, threads, blocks):
    host_threads.parallel_for(lambda i: part(*blocks[i]), len(blocks), threads)


def split_ufunc(ufunc, in_avals, out_aval):
    """ufunc(*xs) written block by block into one new array: an operand
    with the result's rows is sliced, a broadcast one (fewer dimensions or
    one row) is passed whole. Elementwise: the same bits as one call."""
    if not _static((*in_avals, out_aval)):
        return None
    planned = _plan(out_aval, streaming=True)
    if planned is None:
        return None
    threads, blocks = planned
    ndim, rows = out_aval.ndim, out_aval.shape[0]
    sliced = tuple(a.ndim == ndim and a.shape[0] == rows for a in in_avals)
    shape, dtype, empty = tuple(out_aval.shape), out_aval.dtype, np.empty

    def split_elementwise(*xs):
        out = empty(shape, dtype)

        def part(lo, hi):
            ufunc(*[x[lo:hi] if s else x for x, s in zip(xs, sliced)],
                  out=out[lo:hi])

        _run_rows(part, threads, blocks)
        return out

    split_elementwise.__name__ = ufunc.__name__
    return split_elementwise


def split_pad(in_avals, out_aval, config):
    """pad(x, value) with no padding along axis 0 and none negative: each
    thread fills its rows with the padding value and copies its rows of x
    into them (lax.pad's interior padding: a strided copy)."""
    x_aval = in_avals[0]
    if (not _static((x_aval, out_aval)) or tuple(config[0]) != (0, 0, 0)
            or any(lo < 0 or hi < 0 for lo, hi, _ in config)):
        return None
    planned = _plan(out_aval, streaming=True)
    if planned is None:
        return None
    threads, blocks = planned
    inner = (slice(None),) + tuple(
        slice(lo, lo + max(d + (d - 1) * it, 0), it + 1)
        for d, (lo, hi, it) in zip(x_aval.shape[1:], config[1:])
    )
    # Without padding (an identity pad) the copy covers every element.
    fills = any(lo or hi or it for lo, hi, it in config)
    shape, dtype, empty = tuple(out_aval.shape), out_aval.dtype, np.empty

    def split_pad_kernel(x, value):
        out = empty(shape, dtype)

        def part(lo, hi):
            rows = out[lo:hi]
            if fills:
                rows.fill(value)
            rows[inner] = x[lo:hi]

        _run_rows(part, threads, blocks)
        return out

    return split_pad_kernel


def split_rows(kernel, in_avals, out_aval):
    """A kernel whose result's rows along axis 0 each depend only on the
    same rows of its one operand (pooling with a window of 1 on axis 0, a
    reduction that keeps axis 0): each thread runs it on its rows."""
    (x_aval,) = in_avals
    if (not _static((x_aval, out_aval)) or not x_aval.shape
            or not out_aval.shape or x_aval.shape[0] != out_aval.shape[0]):
        return None
    planned = _plan(out_aval, size=x_aval.size)
    if planned is None:
        return None
    threads, blocks = planned
    shape, dtype, empty = tuple(out_aval.shape), out_aval.dtype, np.empty

    def split_rows_kernel(x):
        out = empty(shape, dtype)

        def part(lo, hi):
            out[lo:hi] = kernel(x[lo:hi])

        _run_rows(part, threads, blocks)
        return out

    split_rows_kernel.__name__ = getattr(kernel, "__name__", "kernel")
    return split_rows_kernel


def split_sum(kernel, in_avals, out_aval, axes):
    """A float sum over axes that include 0: each thread sums its rows
    (with the reduction's own kernel), then the partial sums are added in
    row order."""
    (x_aval,) = in_avals
    if (not _static((x_aval, out_aval)) or 0 not in axes
            or x_aval.dtype not in native.FLOAT_DTYPES):
        return None
    # The operand's rows: the result has none.
    planned = _plan(x_aval, streaming=getattr(kernel, "streams", False), blocks_anyway=True)
    if planned is None:
        return None
    threads, blocks = planned

    def split_sum_kernel(x):
        partial = [None] * len(blocks)

        def part(i):
            lo, hi = blocks[i]
            partial[i] = kernel(x[lo:hi])

        host_threads.parallel_for(part, len(blocks), threads)
        total = np.array(partial[0], dtype=out_aval.dtype)
        for p in partial[1:]:
            np.add(total, p, out=total)
        return total

    split_sum_kernel.__name__ = getattr(kernel, "__name__", "kernel")
    return split_sum_kernel


def split_kernel(primitive, params, in_avals, out_avals, kernel, ufunc=None):
    """The lowered `kernel` of one application, split over axis 0 when
    its kind and size qualify (module doc); otherwise `kernel` itself.
    `ufunc`: the NumPy ufunc computing it exactly, when there is one."""
    if (primitive.multiple_results or host_threads.max_threads() <= 1
            or getattr(kernel, "splits_itself", False)):  # a C pool kernel
        return kernel
    (out_aval,) = out_avals
    name = primitive.name
    split = None
    if ufunc is not None:
        split = split_ufunc(ufunc, in_avals, out_aval)
    elif name == "pad":
        split = split_pad(in_avals, out_aval, params["config"])
    elif name == "reduce_window":
        along_0 = (params["window_dimensions"][0], params["window_strides"][0],
                   tuple(params["padding"][0]) if not isinstance(params["padding"], str)
                   else None, params["base_dilation"][0])
        if along_0 == (1, 1, (0, 0), 1):
            split = split_rows(kernel, in_avals, out_aval)
    elif name in ("reduce_sum", "reduce_max", "reduce_min"):
        ndim = in_avals[0].ndim
        axes = (range(ndim) if params["axes"] is None
                else tuple(a % ndim for a in params["axes"]) if ndim else ())
        if 0 not in axes:
            split = split_rows(kernel, in_avals, out_aval)
        elif name == "reduce_sum":
            split = split_sum(kernel, in_avals, out_aval, axes)
    return split or kernel
