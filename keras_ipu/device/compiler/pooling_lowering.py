"""Lowerings of max (min) pooling and its gradient with their C kernels bound.

reduce_window max / min and select_and_scatter_add over windows their one-
pass C kernels take (primitives/pooling.py: extremum_kernel,
select_kernel) run with the window geometry and the split worked out once,
here, instead of in Python at every call. The forward kernel splits itself
on the C pool (`splits_itself`): leading_axis.split_kernel used to split it
again over the Python pool in blocks of a few images, each a Python call
holding the interpreter lock for its geometry while the C pool sat idle,
which ran slower with more threads (the benchmark CNN's first max pool,
128x32x32x32, on a 16-core host: 3.0 ms on one thread, 10.1 on sixteen;
issue 16, sixteenth pass). Anything else keeps the primitive's own kernel
(and, for reduce_window, leading_axis' split of it).
"""

import functools

from keras_ipu.device.compiler.lowering import LOWERINGS
from keras_ipu.device.primitives.conv import resolve_padding
from keras_ipu.device.primitives.pooling import extremum_kernel
from keras_ipu.device.primitives.pooling import reduce_window_p
from keras_ipu.device.primitives.pooling import select_and_scatter_add_p
from keras_ipu.device.primitives.pooling import select_kernel


def _lower_reduce_window(params, in_avals, out_avals):
    generic = functools.partial(reduce_window_p.kernel, **params)
    (x,) = in_avals
    if not x.is_static() or out_avals[0].dtype != x.dtype:
        return generic
    padding = resolve_padding(params["padding"], x.shape, params["window_dimensions"],
                              params["window_strides"], params["base_dilation"],
                              params["window_dilation"])
    kernel = extremum_kernel(x.shape, x.dtype, params["op"], params["window_dimensions"],
                             params["window_strides"], padding, params["base_dilation"],
                             params["window_dilation"])
    if kernel is None:
        return generic

    def reduce_window_extremum(v):
        out = kernel(v)
        return out if out is not None else generic(v)

    reduce_window_extremum.splits_itself = True  # leading_axis.split_kernel leaves it
    return reduce_window_extremum


def _lower_select_and_scatter_add(params, in_avals, out_avals):
    generic = functools.partial(select_and_scatter_add_p.kernel, **params)
    g, x, y = in_avals
    if (not all(a.is_static() for a in in_avals) or g.dtype != x.dtype or y.dtype != x.dtype
            or out_avals[0].dtype != x.dtype):
        return generic
    padding = resolve_padding(params["padding"], x.shape, params["window_dimensions"],
                              params["window_strides"], (1,) * x.ndim,
                              params["window_dilation"])
    kernel = select_kernel(x.shape, y.shape, x.dtype, params["window_dimensions"],
                           params["window_strides"], padding, params["window_dilation"])
    if kernel is None:
        return generic

    def select_and_scatter_add_in_place(gv, xv, yv):
        out = kernel(gv, xv, yv)
        return out if out is not None else generic(gv, xv, yv)

    select_and_scatter_add_in_place.splits_itself = True
    return select_and_scatter_add_in_place


LOWERINGS["reduce_window"] = _lower_reduce_window
LOWERINGS["select_and_scatter_add"] = _lower_select_and_scatter_add
