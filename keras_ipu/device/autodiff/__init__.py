"""Reverse-mode automatic differentiation over the graph IR.

reverse.py is the machinery (Linearized, linearize, restore, graph_vjp),
transforms.py the user-facing transforms (vjp, jvp, grad, value_and_grad),
control_flow.py the gradient rules of control flow (which differentiate
sub-graphs with the machinery: registered here, not with the primitives).

`vjp(fn, *primals)` traces fn into a Graph (trace.trace_flat), evaluates
that graph on the primal values keeping every intermediate value, and
returns the outputs and a function that walks the nodes backwards,
accumulating cotangents and calling each primitive's gradient rule.

Gradient rule contract (`prim.grad`):

    rule(cotangents, inputs, outputs, **params) -> list

`cotangents` has one entry per output (None: zero), `inputs`/`outputs` are
the node's primal operands and results (Tensors, Tracers or NumPy
constants); the rule returns one cotangent per input, None for zero.
Cotangents of broadcast operands are summed back to the operand's shape
(ad_util.unbroadcast); integer and boolean operands get None. A primitive
with `nondiff` set passes no cotangent to its inputs (stop_gradient is
one); reaching a primitive with neither a rule nor a reason is an error.

The rules only bind primitives, so the backward pass is itself traceable:
called with Tracers (inside a trace: a compiled training step) it records
the gradient computation into the running graph; called with concrete
values it runs at once on the host. Nodes recorded for the backward pass
carry a trace.BackwardSource (the forward node's layer path, marked), so
compiler passes can tell the two passes apart (compiler/recompute.py).
Control flow differentiates into control flow (cond -> cond of backward
branches, scan -> reverse scan),
see primitives/control_flow.py. A primitive with a `residual_grad`
(forward, backward) pair (cond, scan) has its forward pass run by the
autodiff itself, storing what its backward pass needs (each step's or the
taken branch's values), so nothing is recomputed.

Complex values: the cotangent c of z is defined by dL = Re(sum(c * dz)) for
a real loss L, so a holomorphic function's rule is the plain transpose of
its derivative (no conjugation), as in JAX.

Only the arguments of `vjp` are differentiated: values fn closes over
(captured outer Tracers, constants) are constants of the backward pass.
`fn` is traced, so it must not branch in Python on tensor values (use
cond/where), as under any compiled function.
"""

# The control-flow gradient rules are the autodiff's: imported here.
from keras_ipu.device.autodiff import control_flow  # noqa: F401 (registers them)
from keras_ipu.device.autodiff.reverse import Linearized
from keras_ipu.device.autodiff.reverse import graph_vjp
from keras_ipu.device.autodiff.reverse import instantiate
from keras_ipu.device.autodiff.reverse import linearize
from keras_ipu.device.autodiff.reverse import restore
from keras_ipu.device.autodiff.transforms import grad
from keras_ipu.device.autodiff.transforms import jvp
from keras_ipu.device.autodiff.transforms import value_and_grad
from keras_ipu.device.autodiff.transforms import vjp

__all__ = [
    "Linearized",
    "grad",
    "graph_vjp",
    "instantiate",
    "jvp",
    "linearize",
    "restore",
    "value_and_grad",
    "vjp",
]
