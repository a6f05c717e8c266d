"""Data crossing IPUs: `ipu_copy(x; src, dst)` moves a value made on IPU
`src` to IPU `dst` over the IPU-Links. The placement pass
(compiler/placement.py) inserts one before the first reader on `dst` of a
value made elsewhere; its value is its operand (on the host the simulator
computes, nothing moves), its cost the link transfer and the global sync
(cost_model.ipu_link_cycles).
"""

from keras_ipu.device.primitives import cost_util
from keras_ipu.device.primitives.registry import Primitive


def _copy_rule(x, *, src, dst):
    return x


def _copy(x, *, src, dst):
    return x


ipu_copy_p = Primitive(
    "ipu_copy", _copy_rule, _copy,
    doc="A value copied from IPU `src` to IPU `dst` over the IPU-Links.",
)


def _copy_grad(cts, inputs, outputs, *, src, dst):
    # The cotangent goes back the way the value came.
    return [ipu_copy_p.bind(cts[0], src=dst, dst=src)]


ipu_copy_p.grad = _copy_grad
ipu_copy_p.cost = cost_util.link
