"""Gradient rules of the primitives of primitives/dot.py (contract:
keras_ipu/device/autodiff/__init__.py), registered when the primitive set
is imported (primitives/__init__.py), after every primitive is declared."""

import numpy as np

from keras_ipu.device.primitives import ad_util
from keras_ipu.device.primitives import structure
from keras_ipu.device.primitives.dot import dot_general_p


def _dot_transpose_lhs(g, y, x_ndim, dims, y_is_lhs=False):
    """Cotangent of the lhs x of dot_general(x, y) for output cotangent g
    (with y_is_lhs: of the rhs, y being the lhs)."""
    (xc, yc), (xb, yb) = dims
    y_ndim = y.ndim
    xf = [d for d in range(x_ndim) if d not in xc and d not in xb]
    yf = [d for d in range(y_ndim) if d not in yc and d not in yb]
    nb = len(xb)
    # Output axes: batch, then lhs free, then rhs free.
    if y_is_lhs:
        g_y_free = list(range(nb, nb + len(yf)))
    else:
        g_y_free = list(range(nb + len(xf), nb + len(xf) + len(yf)))
    g_batch = list(range(nb))
    res = dot_general_p.bind(
        g, y,
        dimension_numbers=((tuple(g_y_free), tuple(yf)),
                           (tuple(g_batch), tuple(yb))),
    )
    # res axes: batch, x free, then y's remaining (contracting) axes in
    # increasing y order, each paired with an x contracting axis.
    order = np.argsort(yc)
    x_axes = list(xb) + xf + [xc[i] for i in order]
    perm = tuple(int(i) for i in np.argsort(x_axes))
    if perm != tuple(range(len(perm))):
        res = structure.transpose_p.bind(res, permutation=perm)
    return res


def _dot_general_grad(cts, inputs, outputs, *, dimension_numbers,
                      preferred_element_type=None):
    (g,), (x, y) = cts, inputs
    (xc, yc), (xb, yb) = dimension_numbers
    g = ad_util.convert(g, x.dtype)
    x_ct = _dot_transpose_lhs(g, y, x.ndim, dimension_numbers)
    y_ct = _dot_transpose_lhs(
        g, x, y.ndim, ((yc, xc), (yb, xb)), y_is_lhs=True)
    return [x_ct, y_ct]


dot_general_p.grad = _dot_general_grad
