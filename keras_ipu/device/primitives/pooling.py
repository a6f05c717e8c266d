"""Windowed reductions: `reduce_window` (lax.reduce_window for max, sum and
min), the kernel of every pooling op; and `select_and_scatter_add`, the
gradient of its max and min (a max pool's gradient: TensorFlow's
MaxPoolGrad, XLA's select-and-scatter).

The window, strides, dilations and padding cover every axis of the operand
(pooling over spatial axes only uses 1 for the batch and channel axes).
Padded cells hold the reduction's identity (-inf for max, +inf for min, 0
for sum), so they never win a max and add nothing to a sum; average pooling
divides by a count of real cells built the same way.

Max and min pools with no padding, and their gradients over windows that
do not overlap, run in one C pass where native/_pooling.c is built (the
NumPy kernels below are the reference and the fallback).

Gradient rules: grads/pooling.py (registered once every primitive exists).
"""

import numpy as np

from keras_ipu.device import native
from keras_ipu.device.ir import ShapedArray
from keras_ipu.device.native import product_pool
from keras_ipu.device.native import threads as host_threads
from keras_ipu.device.primitives import cost_util as _cost
from keras_ipu.device.primitives import shape_rules
from keras_ipu.device.primitives.conv import dilate_and_pad
from keras_ipu.device.primitives.conv import resolve_padding
from keras_ipu.device.primitives.conv import static_padding
from keras_ipu.device.primitives.registry import Primitive
from keras_ipu.device.simulator import cost_model

_OPS = ("max", "sum", "min")


def identity(op, dtype):
    """The value padding takes for `op` on `dtype`."""
    dtype = np.dtype(dtype)
    if op == "sum":
        return dtype.type(0)
    if dtype.kind == "b":
        return op == "min"
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return info.min if op == "max" else info.max
    return -np.inf if op == "max" else np.inf


def _check(x, op, window_dimensions, window_strides, padding, base_dilation,
           window_dilation):
    if op not in _OPS:
        raise ValueError(
            f"reduce_window: op={op!r} is not one of {_OPS}."
        )
    for name, value in (
        ("window_dimensions", window_dimensions),
        ("window_strides", window_strides),
        ("padding", padding),
        ("base_dilation", base_dilation),
        ("window_dilation", window_dilation),
    ):
        if len(value) != x.ndim:
            raise shape_rules.ShapeError(
                f"reduce_window: `{name}`={value} needs one entry per axis "
                f"of the operand (rank {x.ndim})."
            )
    if min(window_dimensions + window_strides + base_dilation
           + window_dilation, default=1) < 1:
        raise shape_rules.ShapeError(
            "reduce_window: window sizes, strides and dilations must be "
            f"positive, got window={window_dimensions}, "
            f"strides={window_strides}, base_dilation={base_dilation}, "
            f"window_dilation={window_dilation}."
        )


def _out_dim(n, k, stride, pad, base_dil, win_dil):
    if n is None or pad is None:
        return None
    n = (n - 1) * base_dil + 1 if n > 0 else 0
    span = n + pad[0] + pad[1] - ((k - 1) * win_dil + 1)
    return span // stride + 1 if span >= 0 else 0


def _reduce_window_rule(x, *, op, window_dimensions, window_strides, padding,
                        base_dilation, window_dilation):
    _check(x, op, window_dimensions, window_strides, padding, base_dilation,
           window_dilation)
    padding = resolve_padding(padding, x.shape, window_dimensions,
                              window_strides, base_dilation, window_dilation)
    shape = tuple(
        _out_dim(*args)
        for args in zip(x.shape, window_dimensions, window_strides, padding,
                        base_dilation, window_dilation)
    )
    return ShapedArray(shape, x.dtype)


_REDUCERS = {"max": np.max, "sum": np.sum, "min": np.min}


def _reduce_window(x, *, op, window_dimensions, window_strides, padding,
                   base_dilation, window_dilation):
    dtype = x.dtype
    axes = tuple(range(x.ndim))
    padding = resolve_padding(padding, x.shape, window_dimensions,
                              window_strides, base_dilation, window_dilation)
    if native.pooling is not None and op != "sum":
        out = _extremum_in_place(x, op, window_dimensions, window_strides, padding,
                                 base_dilation, window_dilation)
        if out is not None:
            return out
    # Dilation holes hold the identity too, so fill after dilating.
    if any(d > 1 for d in base_dilation):
        x = dilate_and_pad(x, axes, base_dilation, ((0, 0),) * x.ndim, 0)
        holes = np.ones(x.shape, bool)
        holes[tuple(slice(None, None, d) for d in base_dilation)] = False
        x = np.where(holes, identity(op, dtype), x).astype(dtype)
    x = dilate_and_pad(x, axes, (1,) * x.ndim, padding, identity(op, dtype))
    span = tuple((k - 1) * d + 1 for k, d in zip(window_dimensions,
                                                  window_dilation))
    out_shape = tuple(
        (n - s) // st + 1 if n >= s else 0
        for n, s, st in zip(x.shape, span, window_strides)
    )
    if 0 in out_shape or x.size == 0:
        return np.full(out_shape, identity(op, dtype), dtype)
    win = np.lib.stride_tricks.sliding_window_view(x, span)
    win = win[tuple(slice(None, None, st) for st in window_strides)
              + tuple(slice(None, None, d) for d in window_dilation)]
    reduce_axes = tuple(range(x.ndim, 2 * x.ndim))
    if op == "sum" and dtype.kind == "f" and dtype.itemsize < 4:
        out = np.sum(win, axis=reduce_axes, dtype=np.float32)
    else:
        out = _REDUCERS[op](win, axis=reduce_axes)
    return np.ascontiguousarray(out.astype(dtype, copy=False))


def _extremum_in_place(x, op, window_dimensions, window_strides, padding, base_dilation,
                       window_dilation):
    """reduce_window max or min in one C pass (native/_pooling.c): see
    extremum_kernel. None where the C kernel does not apply: the caller
    runs the NumPy kernel."""
    kernel = extremum_kernel(x.shape, x.dtype, op, window_dimensions, window_strides, padding,
                             base_dilation, window_dilation)
    return None if kernel is None else kernel(x)


def extremum_kernel(shape, dtype, op, window_dimensions, window_strides, padding,
                    base_dilation, window_dilation):
    """f(x) -> reduce_window max or min of an operand of `shape` and
    `dtype` in one C pass (native/_pooling.c) over windows with no padding
    (resolved (lo, hi) pairs) and no base dilation, overlapping or not,
    each tap read in place: NaN wins as in NumPy's max (min). f returns
    None where the C kernel refuses the buffers. The geometry and the
    split are worked out here once: a compiled program binds them at
    lowering (compiler/pooling_lowering.py), where each call worked them
    out again in Python. None where the C kernel does not apply."""
    dtype = np.dtype(dtype)
    if (native.pooling is None or op not in ("max", "min") or dtype not in native.FLOAT_DTYPES
            or len(shape) > 32 or any(d != 1 for d in base_dilation)
            or any(lo or hi for lo, hi in padding)):
        return None
    out_shape = tuple(_out_dim(n, k, s, (0, 0), 1, d) for n, k, s, d in zip(
        shape, window_dimensions, window_strides, window_dilation))
    if 0 in out_shape or 0 in shape:
        return None
    inner, geometry = _window_geometry(shape, out_shape, window_dimensions, window_strides,
                                       window_dilation)
    cells = int(np.prod(shape, dtype=np.int64))
    rows = int(np.prod(out_shape, dtype=np.int64)) // inner
    # Four taps read per result written, compared in registers: not at
    # the memory's speed, so it splits on any host (module doc).
    run = _rows_runner(native.pooling.reduce_max, cells, rows, streams=False)
    empty, contiguous, is_min = np.empty, np.ascontiguousarray, op == "min"

    def reduce_window_in_place(x):
        out = empty(out_shape, dtype)
        done = run(contiguous(x), out, inner, *geometry, is_min)
        return out if done is not False else None

    return reduce_window_in_place


reduce_window_p = Primitive(
    "reduce_window",
    _reduce_window_rule,
    _reduce_window,
    fp_class="checked",
    doc="lax.reduce_window for op in max/sum/min, padded with op's identity.",
)


def reduce_window(x, op, window_dimensions, window_strides=None,
                  padding=None, base_dilation=None, window_dilation=None):
    """Bind reduce_window with every parameter as a per-axis tuple.

    padding: (lo, hi) pairs per axis, or "VALID"/"SAME" (XLA's rule).
    """
    ndim = len(x.shape)
    window_dimensions = tuple(int(w) for w in window_dimensions)
    window_strides = tuple(int(s) for s in (window_strides or (1,) * ndim))
    base_dilation = tuple(int(d) for d in (base_dilation or (1,) * ndim))
    window_dilation = tuple(int(d) for d in (window_dilation or (1,) * ndim))
    if padding is None:
        padding = "VALID"
    padding = static_padding(padding, list(x.shape), window_dimensions,
                             window_strides, base_dilation, window_dilation)
    return reduce_window_p.bind(
        x,
        op=op,
        window_dimensions=window_dimensions,
        window_strides=window_strides,
        padding=padding,
        base_dilation=base_dilation,
        window_dilation=window_dilation,
    )


def _window_views(shape, out_shape, window_dimensions, window_strides,
                  window_dilation):
    """The slices of each window tap, in row-major tap order: the tap's
    strided view of an operand of `shape` (padded) has the window
    results' shape `out_shape`."""
    for tap in np.ndindex(*window_dimensions):
        starts = tuple(t * d for t, d in zip(tap, window_dilation))
        yield tuple(slice(s, s + (n - 1) * st + 1, st)
                         for s, n, st in zip(starts, out_shape, window_strides))


def _select_and_scatter_add_rule(g, x, y, *, op, window_dimensions, window_strides,
                                 padding, window_dilation):
    if op not in ("max", "min"):
        raise ValueError(f"select_and_scatter_add: op={op!r} is not max or min.")
    if g.shape != y.shape:
        raise shape_rules.ShapeError(
            f"select_and_scatter_add: the cotangent {g.shape} must have the "
            f"window results' shape {y.shape}."
        )
    want = _reduce_window_rule(x, op=op, window_dimensions=window_dimensions,
                               window_strides=window_strides, padding=padding,
                               base_dilation=(1,) * x.ndim,
                               window_dilation=window_dilation)
    if want.shape != y.shape:
        raise shape_rules.ShapeError(
            f"select_and_scatter_add: the window results {y.shape} are not "
            f"those of the operand {x.shape} ({want.shape})."
        )
    return ShapedArray(x.shape, g.dtype)


def _select_and_scatter_add(g, x, y, *, op, window_dimensions, window_strides,
                            padding, window_dilation):
    """In each window of `x` the first tap, in row-major order, equal to
    the window's result `y` takes the window's cotangent `g`; each element
    of the result sums what it took. Padding is never picked (as XLA's
    select-and-scatter and TensorFlow's MaxPoolGrad): a window whose
    result is the identity (-inf for max) picks its first real tap holding
    it, and a window of padding alone picks nothing. A NaN result picks
    nothing (NaN equals nothing). Half floats sum in float32, rounded once."""
    padding = resolve_padding(padding, x.shape, window_dimensions, window_strides,
                              (1,) * x.ndim, window_dilation)
    if native.pooling is not None:
        out = _select_disjoint(g, x, y, window_dimensions, window_strides, padding,
                               window_dilation)
        if out is not None:
            return out
    axes = tuple(range(x.ndim))
    pad_value = identity(op, x.dtype)
    xp = dilate_and_pad(x, axes, (1,) * x.ndim, padding, pad_value)
    # A padding cell equals a window's result only where that result is
    # the identity itself: only then are the real cells told apart.
    real = None
    if any(lo > 0 or hi > 0 for lo, hi in padding) and y.size and (y == pad_value).any():
        real = dilate_and_pad(np.ones(x.shape, bool), axes, (1,) * x.ndim, padding, False)
    work = np.float32 if g.dtype.kind == "f" and g.dtype.itemsize < 4 else g.dtype
    # Windows that tile the padded operand write every element once: no
    # zero fill first (16 MB per step for the CNN benchmark's first pool).
    tiled = all(k == s and d == 1 and n == m * s for k, s, d, n, m in zip(
        window_dimensions, window_strides, window_dilation, xp.shape, y.shape))
    acc = (np.empty if tiled and 0 not in y.shape else np.zeros)(xp.shape, work)
    # Windows that do not overlap write each element at most once: the
    # share itself (what the concatenate of the per-tap pads gave), not
    # 0 + share (which would turn a -0.0 into +0.0).
    overlap = any(
        (k - 1) * d + 1 > s for k, d, s in zip(window_dimensions, window_dilation,
                                               window_strides))
    if 0 not in y.shape:
        # Masks and shares in place, the share selected by its bits (g's
        # bits and all-ones or zero: +0.0 where not taken): np.where and
        # np.copyto(where=) branch per element, 3-5x the time on a
        # ReLU's unpredictable masks (issue 16). hit & ~taken is
        # hit > taken for booleans.
        uint = np.dtype(f"u{acc.itemsize}")
        g_bits = np.ascontiguousarray(g, dtype=work).view(uint)
        acc_bits = acc.view(uint)
        hit = np.empty(y.shape, bool)
        taken = np.zeros(y.shape, bool)
        mask = np.empty(y.shape, uint)
        share = np.empty(y.shape, work) if overlap else None
        views = list(_window_views(xp.shape, y.shape, window_dimensions,
                                   window_strides, window_dilation))
        for k, view in enumerate(views):
            np.equal(xp[view], y, out=hit)
            if real is not None:
                np.logical_and(hit, real[view], out=hit)
            if k:
                np.greater(hit, taken, out=hit)
            if k + 1 < len(views):
                np.logical_or(taken, hit, out=taken)
            np.multiply(hit, uint.type(-1 % (1 << 8 * uint.itemsize)), out=mask)
            if overlap:
                np.bitwise_and(g_bits, mask, out=share.view(uint))
                into = acc[view]
                np.add(into, share, out=into)
            else:
                np.bitwise_and(g_bits, mask, out=acc_bits[view])
    unpad = tuple((-lo, -hi) for lo, hi in padding)
    out = dilate_and_pad(acc, axes, (1,) * x.ndim, unpad, 0)
    return np.ascontiguousarray(out.astype(g.dtype, copy=False))


def _select_disjoint(g, x, y, window_dimensions, window_strides, padding,
                     window_dilation):
    """_select_and_scatter_add in one C pass (native/_pooling.c): see
    select_kernel. None where the C kernel does not apply: the caller
    runs the NumPy kernel."""
    if g.dtype != x.dtype or y.dtype != x.dtype:
        return None
    kernel = select_kernel(x.shape, y.shape, x.dtype, window_dimensions, window_strides,
                           padding, window_dilation)
    return None if kernel is None else kernel(g, x, y)


def select_kernel(x_shape, y_shape, dtype, window_dimensions, window_strides, padding,
                  window_dilation):
    """f(g, x, y) -> _select_and_scatter_add in one C pass (native/
    _pooling.c) for operands of one float `dtype`, where the windows do
    not overlap and hold no padding (a max pool of stride = window, as
    Keras' default MaxPooling2D): each cell then belongs to one window at
    most, and takes its cotangent or +0.0 (the same bits as the NumPy
    kernel). f returns None where the C kernel refuses the buffers. As
    extremum_kernel, the geometry is worked out once. None where the C
    kernel does not apply."""
    dtype = np.dtype(dtype)
    if (native.pooling is None or dtype not in native.FLOAT_DTYPES or 0 in x_shape
            or 0 in y_shape or len(x_shape) > 32
            or any(lo or hi for lo, hi in padding)
            or any(k > s or (k > 1 and d != 1) for k, s, d in zip(
                window_dimensions, window_strides, window_dilation))):
        return None
    x_shape, y_shape = tuple(x_shape), tuple(y_shape)
    tiled = all(k == s and n == m * s for k, s, n, m in zip(
        window_dimensions, window_strides, x_shape, y_shape))
    inner, geometry = _window_geometry(x_shape, y_shape, window_dimensions, window_strides,
                                       window_dilation)
    cells = int(np.prod(x_shape, dtype=np.int64))
    # One read of x, y and g and one write per cell: at the memory's
    # speed (2 threads: no gain on this project's 2-core VM).
    run = _rows_runner(native.pooling.select_tiled, cells,
                       int(np.prod(y_shape, dtype=np.int64)) // inner, streams=True)
    fresh, contiguous = np.empty if tiled else np.zeros, np.ascontiguousarray

    def select_in_place(g, x, y):
        out = fresh(x_shape, dtype)
        done = run(contiguous(g), contiguous(x), contiguous(y), out, inner, *geometry)
        return out if done is not False else None

    return select_in_place


def _window_geometry(x_shape, y_shape, window_dimensions, window_strides, window_dilation):
    """(inner, (lead, steps, taps)) of windows with no padding over a
    C-contiguous operand, as native/_pooling.c takes them: the trailing
    axes no window spans are each window's row of `inner` cells; `lead`
    the window results' shape before them, `steps` the operand's element
    offset per window along each, `taps` each tap's offset in row-major
    tap order."""
    lead = len(x_shape)
    while lead and window_dimensions[lead - 1] == 1 and window_strides[lead - 1] == 1:
        lead -= 1
    inner = int(np.prod(x_shape[lead:], dtype=np.int64))
    cell_strides = np.cumprod((1,) + tuple(x_shape[:0:-1]), dtype=np.int64)[::-1]
    steps = np.array([s * c for s, c in zip(window_strides[:lead], cell_strides)], np.int64)
    reach = cell_strides * np.asarray(window_dilation, np.int64)
    taps = np.array([np.dot(tap, reach) for tap in np.ndindex(*window_dimensions)], np.int64)
    return inner, (np.array(y_shape[:lead], np.int64), steps, taps)


def _rows_runner(kernel, cells, rows, streams):
    """run(*args): a native/_pooling.c kernel over `rows` rows of window
    results reading `cells` operand cells, split on the C pool where
    _row_threads says (tasks of whole rows, BLOCKS_PER_THREAD per thread:
    threads.split_kernel); its result (False: the buffers did not fit,
    nothing written)."""
    threads = _row_threads(cells, rows, streams)
    if threads <= 1:
        return kernel
    per_task = -(-rows // (threads * host_threads.BLOCKS_PER_THREAD))
    return host_threads.split_kernel(kernel, threads, -(-rows // per_task), per_task)


def _row_threads(cells, rows, streams):
    """Threads of the C pool a one-pass pooling kernel over `cells` cells
    splits over, as a fused chain of as many elements. `streams`: at the
    memory's speed (each cell read once), so only where a second thread
    adds memory bandwidth (threads.streaming_scales). The forward max
    (min) is not: on this 2-core VM (load 0.9) 128x32x32x32 ran 3.0-3.1
    ms median on one thread, 1.0-2.1 in 4 tasks on two (issue 16,
    sixteenth pass)."""
    if not product_pool.tasks_available() or rows < 2:
        return 1
    threads = min(host_threads.chain_threads(cells), rows)
    if threads <= 1 or (streams and not host_threads.streaming_scales()):
        return 1
    return threads


select_and_scatter_add_p = Primitive(
    "select_and_scatter_add",
    _select_and_scatter_add_rule,
    _select_and_scatter_add,
    fp_class="accumulating",
    doc="The gradient of reduce_window max/min: (cotangent, operand, window "
        "results) -> each window's cotangent added where its first extremum is.",
)


def select_and_scatter_add(g, x, y, op, window_dimensions, window_strides, padding,
                           window_dilation):
    """Bind select_and_scatter_add: `y` is reduce_window(x, op, ...) with
    the same window (resolved (lo, hi) padding pairs, no base dilation),
    `g` the cotangent of `y`."""
    return select_and_scatter_add_p.bind(
        g, x, y, op=op, window_dimensions=tuple(window_dimensions),
        window_strides=tuple(window_strides), padding=tuple(map(tuple, padding)),
        window_dilation=tuple(window_dilation))


# -- cost rules (formulas and constants: keras_ipu/device/simulator/cost_model.py)


def _window_size(window_dimensions):
    return int(np.prod(window_dimensions, dtype=np.int64))


def _reduce_window_flops(ins, outs, *, window_dimensions, **params):
    return _cost.size(outs[0]) * _window_size(window_dimensions)


reduce_window_p.cost = _cost.per_output("reduce", _reduce_window_flops)


def _select_and_scatter_add_flops(ins, outs, *, window_dimensions, **params):
    return (_cost.size(ins[2]) * _window_size(window_dimensions)
            * cost_model.POOL_GRAD_FLOPS_PER_TAP)


select_and_scatter_add_p.cost = _cost.per_output("elementwise",
                                                 _select_and_scatter_add_flops)
