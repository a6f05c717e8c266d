"""Gradient rules of the primitives of primitives/convert.py (contract:
keras_ipu/device/autodiff/__init__.py), registered when the primitive set
is imported (primitives/__init__.py), after every primitive is declared."""

import numpy as np

from keras_ipu.device.primitives import ad_util
from keras_ipu.device.primitives.convert import convert_element_type_p


def _convert_grad(cts, inputs, outputs, *, dtype):
    (g,), (x,) = cts, inputs
    # Through an integer or bool dtype (either side) no gradient flows.
    if not ad_util.is_differentiable(x.dtype):
        return [None]
    if not ad_util.is_differentiable(np.dtype(dtype)):
        return [None]
    return [ad_util.convert(g, x.dtype)]


convert_element_type_p.grad = _convert_grad
