"""The machinery of reverse mode: evaluate a graph keeping every value
(linearize), then walk its nodes backwards accumulating cotangents and
calling each primitive's gradient rule (Linearized.backward). The contract
of the rules is in autodiff/__init__.py."""

import numpy as np

from keras_ipu.device import interpreter
from keras_ipu.device.ir import Literal
from keras_ipu.device.primitives import ad_util
from keras_ipu.device.trace import node_scope


def _missing_rule_error(prim):
    return NotImplementedError(
        f"Reverse-mode differentiation of the primitive `{prim.name}` is not "
        "implemented: it has no gradient rule. Wrap the value in "
        "stop_gradient if no gradient should flow through it, or give the "
        "computation a custom gradient (keras.ops.custom_gradient)."
    )


class Linearized:
    """A graph evaluated on primal values, ready to run backwards."""

    def __init__(self, graph, env, outputs, active):
        self.graph = graph
        self.env = env
        self.outputs = outputs
        # Ids of the values that depend on the differentiated inputs: only
        # nodes producing them are run backwards.
        self.active = active
        # Per node index: what a residual rule's forward stored for it.
        self.residuals = {}

    def read(self, operand):
        return _read(self.env, operand)

    def backward(self, out_cts):
        """Cotangents of the graph inputs (None: zero) for `out_cts`, one
        per graph output (None: zero)."""
        graph = self.graph
        if len(out_cts) != len(graph.outputs):
            raise TypeError(
                f"vjp: got {len(out_cts)} cotangents for {len(graph.outputs)} "
                "outputs; pass one per output."
            )
        cts = {}

        def accumulate(var, ct, prim=None):
            if ct is None or isinstance(var, Literal):
                return
            if not ad_util.is_differentiable(var.aval.dtype):
                return
            _check_shape(ct, var.aval, prim)
            ct = ad_util.convert(ct, var.aval.dtype)
            prev = cts.get(var.id)
            cts[var.id] = ct if prev is None else ad_util.add_any(prev, ct)

        for var, ct in zip(graph.outputs, out_cts):
            accumulate(var, ct)
        for index in range(len(graph.nodes) - 1, -1, -1):
            node = graph.nodes[index]
            node_cts = [cts.pop(v.id, None) for v in node.outputs]
            if all(c is None for c in node_cts):
                continue
            if not any(v.id in self.active for v in node.outputs):
                continue
            prim = node.primitive
            if prim.nondiff is not None:
                continue
            if prim.grad is None:
                raise _missing_rule_error(prim)
            inputs = [self.read(v) for v in node.inputs]
            outputs = [self.env[v.id] for v in node.outputs]
            with node_scope(node, backward=True):
                if index in self.residuals:
                    _, backward = prim.residual_grad
                    in_cts = backward(node_cts, inputs, outputs,
                                      self.residuals[index], **node.params)
                else:
                    in_cts = prim.grad(node_cts, inputs, outputs, **node.params)
            if len(in_cts) != len(node.inputs):
                raise RuntimeError(
                    f"The gradient rule of `{prim.name}` returned "
                    f"{len(in_cts)} cotangents for {len(node.inputs)} inputs."
                )
            # Summing the cotangents of a value read twice belongs to the
            # layer whose gradient adds in (not to "no layer" in profiles).
            with node_scope(node):
                for var, ct in zip(node.inputs, in_cts):
                    accumulate(var, ct, prim)
        return [cts.get(v.id) for v in graph.inputs]


def _read(env, operand):
    if type(operand) is Literal:
        value = operand.value
        # Rules read .shape/.dtype: Python scalars become 0-d arrays.
        return value if hasattr(value, "shape") else np.asarray(value)
    return env[operand.id]


def linearize(graph, inputs, n_active=None):
    """Evaluate `graph` on `inputs` keeping every value (the residuals the
    gradient rules read). Returns a Linearized. Only the first `n_active`
    inputs (default: all) are differentiated; the others (captured outer
    values) are constants of the backward pass."""
    if n_active is None:
        n_active = len(inputs)
    active = {v.id for v in graph.inputs[:n_active]
              if ad_util.is_differentiable(v.aval.dtype)}
    residuals = {}

    def apply(index, node, args):
        prim = node.primitive
        if _propagate(node, active) and prim.residual_grad is not None:
            forward, _ = prim.residual_grad
            outs, stored = forward(args, node.params)
            if stored is not None:
                residuals[index] = stored
            return outs
        return interpreter.bind_node(index, node, args)

    env = interpreter.evaluate(graph, list(inputs), apply, _read)
    lin = Linearized(graph, env, None, active)
    lin.residuals = residuals
    lin.outputs = [lin.read(v) for v in graph.outputs]
    return lin


def _check_shape(ct, aval, prim):
    """A cotangent has its value's shape (unknown dims match anything): a
    rule that forgot to sum a broadcast back fails here, not later."""
    shape = tuple(ct.shape)
    if len(shape) == len(aval.shape) and all(
        a is None or b is None or a == b for a, b in zip(shape, aval.shape)
    ):
        return
    where = f"the gradient rule of `{prim.name}`" if prim else "vjp_fn"
    raise ValueError(
        f"{where} gave a cotangent of shape {shape} for a value of shape "
        f"{aval.shape}; cotangents must have their value's shape."
    )


def _propagate(node, active):
    """Mark node's differentiable outputs active if an input is; returns
    whether the node is active."""
    if any(not isinstance(v, Literal) and v.id in active for v in node.inputs):
        active.update(v.id for v in node.outputs
                      if ad_util.is_differentiable(v.aval.dtype))
        return True
    return False


def restore(graph, env):
    """A Linearized from stored values (`env`: every input and node output
    by Var id), differentiating all inputs: nothing is recomputed."""
    active = {v.id for v in graph.inputs
              if ad_util.is_differentiable(v.aval.dtype)}
    for node in graph.nodes:
        _propagate(node, active)
    lin = Linearized(graph, env, None, active)
    lin.outputs = [lin.read(v) for v in graph.outputs]
    return lin


def graph_vjp(graph, inputs, out_cts):
    """Input cotangents of `graph` at `inputs` for output cotangents
    `out_cts` (None: zero); recomputes the forward values first."""
    return linearize(graph, inputs).backward(list(out_cts))


def instantiate(ct, like):
    """ct, or zeros shaped like `like` when ct is None (zero)."""
    return ad_util.zeros_like(like) if ct is None else ct
