"""Lowerings of reshape and of float reductions with their params bound.

reshape becomes the ndarray method call with the (static) output shape;
float sum/prod/max/min reductions call the ufunc's `reduce` directly (what
np.sum & co. do after their argument handling), with a 0-d result turned
back into an ndarray. Other dtypes keep the eager kernel, which also fixes
the result dtype of integer sums.
"""

import numpy as np

from keras_ipu.device.compiler.lowering import LOWERINGS

_FLOATS = frozenset(np.dtype(t) for t in (np.float16, np.float32, np.float64))


def _lower_reshape(params, in_avals, out_avals):
    shape = out_avals[0].shape

    def reshape(x):
        return x.reshape(shape)

    return reshape


def _reduction(ufunc, primitive_name):
    def build(params, in_avals, out_avals):
        from keras_ipu.device.primitives import REGISTRY

        (x,), (out,) = in_avals, out_avals
        axes = tuple(params["axes"]) if params["axes"] is not None else None
        if x.dtype not in _FLOATS or out.dtype != x.dtype:
            kernel = REGISTRY[primitive_name].kernel

            def generic(v):
                return np.asarray(kernel(v, axes=params["axes"]))

            return generic
        reduce = ufunc.reduce
        if out.ndim == 0:
            asarray = np.asarray

            def reduce_to_scalar(v):
                return asarray(reduce(v, axis=axes))

            return reduce_to_scalar

        def reduce_axes(v):
            return reduce(v, axis=axes)

        return reduce_axes

    return build


LOWERINGS["reshape"] = _lower_reshape
LOWERINGS["reduce_sum"] = _reduction(np.add, "reduce_sum")
LOWERINGS["reduce_prod"] = _reduction(np.multiply, "reduce_prod")
LOWERINGS["reduce_max"] = _reduction(np.maximum, "reduce_max")
LOWERINGS["reduce_min"] = _reduction(np.minimum, "reduce_min")
