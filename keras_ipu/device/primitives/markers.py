"""Identity primitives that mark a value for the compiler.

They compute nothing (the value and its gradient pass through unchanged);
what they say is read by compiler passes:

- recomputation_checkpoint(x): with recomputation on, x is stored for the
  backward pass instead of being recomputed, and the recomputation of the
  values after it starts from it (compiler/recompute.py). Graphcore's
  `pipelining_ops.recomputation_checkpoint` and the RecomputationCheckpoint
  layer bind it; a pipeline marks its stage inputs with it too.
- assume_equal_across_replicas(x; inplace): x has the same value on every
  replica, so a branch on it cannot diverge between replicas (Graphcore's
  `cross_replica_ops.assume_equal_across_replicas`). `inplace` says whether
  the IPU aliases the input (Poplar copies otherwise).
"""

from keras_ipu.device.primitives import cost_util as _cost
from keras_ipu.device.primitives.registry import Primitive


def _same(x, **params):
    return x


def _pass_cotangent(cts, inputs, outputs, **params):
    return list(cts)


recomputation_checkpoint_p = Primitive(
    "recomputation_checkpoint",
    _same,
    _same,
    aliases_operands=True,
    doc="Identity; with recomputation on, the value is stored for the "
        "backward pass and recomputation restarts from it.",
)
recomputation_checkpoint_p.grad = _pass_cotangent
recomputation_checkpoint_p.cost = _cost.view

assume_equal_across_replicas_p = Primitive(
    "assume_equal_across_replicas",
    _same,
    _same,
    doc="Identity; the value is equal on every replica (no divergent "
        "control flow from it).",
)
assume_equal_across_replicas_p.grad = _pass_cotangent
assume_equal_across_replicas_p.cost = _cost.view


def recomputation_checkpoint(x):
    return recomputation_checkpoint_p.bind(x)


def assume_equal_across_replicas(x, inplace=False):
    return assume_equal_across_replicas_p.bind(x, inplace=bool(inplace))
