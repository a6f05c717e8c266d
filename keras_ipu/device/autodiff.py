"""Reverse-mode automatic differentiation over the graph IR.

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

import numpy as np

from keras_ipu.device import interpreter
from keras_ipu.device import pytree
from keras_ipu.device.array import Tensor
from keras_ipu.device.ir import Literal
from keras_ipu.device.ir import ShapedArray
from keras_ipu.device.primitives import ad_util
from keras_ipu.device.trace import backward_source
from keras_ipu.device.trace import source_scope
from keras_ipu.device.trace import Tracer
from keras_ipu.device.trace import trace_flat


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
            with source_scope(backward_source(node.source)):
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
            with source_scope(node.source):
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


# -- the user-facing transforms ---------------------------------------------


def _as_array(x):
    if isinstance(x, (Tensor, Tracer)):
        return x
    variable_value = getattr(x, "value", None)
    if variable_value is not None and isinstance(variable_value, (Tensor, Tracer)):
        return variable_value
    return Tensor(np.asarray(x))


def _aval(x):
    return ShapedArray(x.shape, x.dtype)


def vjp(fn, *primals, has_aux=False):
    """(outputs, vjp_fn): fn(*primals) and the function that maps output
    cotangents (same structure as the outputs) to primal cotangents (same
    structure as the primals). With has_aux, fn returns (outputs, aux) and
    the result is (outputs, vjp_fn, aux); aux is not differentiated."""
    primal_leaves, primal_tree = pytree.flatten(primals)
    flat = [_as_array(x) for x in primal_leaves]
    box = {}

    def flat_fn(*tracers):
        out = fn(*pytree.unflatten(primal_tree, list(tracers)))
        if has_aux:
            if not (isinstance(out, (tuple, list)) and len(out) == 2):
                raise ValueError(
                    "With has_aux=True the function must return "
                    "(outputs, aux); got " + type(out).__name__
                )
            out, aux = out
            aux_leaves, box["aux_tree"] = pytree.flatten(aux)
            aux_leaves = [_as_array(a) for a in aux_leaves]
        else:
            aux_leaves = []
        leaves, box["tree"] = pytree.flatten(out)
        leaves = [_as_array(o) for o in leaves]
        box["n_out"] = len(leaves)
        return leaves + aux_leaves

    graph, captures = trace_flat(flat_fn, [_aval(x) for x in flat])
    lin = linearize(graph, flat + list(captures), n_active=len(flat))
    n_out = box["n_out"]
    outputs = pytree.unflatten(box["tree"], lin.outputs[:n_out])

    def vjp_fn(cotangents):
        ct_leaves = pytree.flatten_like(box["tree"], cotangents, "vjp_fn: the cotangents")
        if len(ct_leaves) != n_out:
            raise ValueError(
                f"vjp_fn: got {len(ct_leaves)} cotangents for {n_out} "
                "outputs; pass one per output (same structure)."
            )
        cts = [None if c is None else _as_array(c) for c in ct_leaves]
        in_cts = lin.backward(cts + [None] * (len(graph.outputs) - n_out))
        grads = [instantiate(ct, x) for ct, x in zip(in_cts[: len(flat)], flat)]
        return pytree.unflatten(primal_tree, grads)

    if has_aux:
        aux = pytree.unflatten(box["aux_tree"], lin.outputs[n_out:])
        return outputs, vjp_fn, aux
    return outputs, vjp_fn


def jvp(fn, primals, tangents, has_aux=False):
    """(outputs, output tangents) of fn at `primals` along `tangents` (same
    structure as primals); with has_aux, fn returns (outputs, aux) and the
    result is (outputs, output tangents, aux).

    Forward mode by transposing reverse mode: vjp_fn maps output cotangents
    u to J^T u, linearly in u, so the vjp of vjp_fn (at any u, zeros here)
    maps t to J t. It costs two reverse passes and needs the gradient rules
    of the rules (most bind differentiable primitives); a rule binding a
    primitive without a gradient fails with that primitive's name.
    """
    primals = tuple(primals)
    tangents = tuple(tangents)
    flat_p = pytree.leaves(primals)
    flat_t = pytree.leaves(tangents)
    if len(flat_p) != len(flat_t):
        raise ValueError(
            f"jvp: got {len(flat_t)} tangents for {len(flat_p)} primals; pass "
            "one tangent per primal, in the same structure."
        )
    for p, t in zip(flat_p, flat_t):
        if tuple(np.shape(p)) != tuple(np.shape(t)):
            raise ValueError(
                f"jvp: a tangent has shape {tuple(np.shape(t))} but its primal "
                f"has shape {tuple(np.shape(p))}; each tangent must match its "
                "primal."
            )
    result = vjp(fn, *primals, has_aux=has_aux)
    outputs, vjp_fn = result[0], result[1]
    out_leaves, out_tree = pytree.flatten(outputs)
    zeros = [ad_util.zeros_like(_as_array(o)) for o in out_leaves]

    def transpose(*us):
        return pytree.leaves(vjp_fn(pytree.unflatten(out_tree, list(us))))

    _, vjp_of_vjp = vjp(transpose, *zeros)
    out_tangents = vjp_of_vjp([_as_array(t) for t in flat_t])
    out_tangents = pytree.unflatten(out_tree, list(out_tangents))
    if has_aux:
        return outputs, out_tangents, result[2]
    return outputs, out_tangents


def _check_scalar(value):
    if tuple(value.shape) != () or not ad_util.is_differentiable(value.dtype):
        raise TypeError(
            "grad needs a function returning a float scalar; it returned "
            f"shape {tuple(value.shape)} dtype {value.dtype}. Reduce it (e.g. "
            "with keras.ops.sum or mean) or use vjp for non-scalar outputs."
        )


def value_and_grad(fn, argnums=0, has_aux=False):
    """fn's value and its gradient with respect to the arguments `argnums`
    (an int or a tuple of ints; a tuple gives a tuple of gradients). fn must
    return a float scalar (with has_aux: (scalar, aux) and the value is
    (scalar, aux))."""
    single = isinstance(argnums, int)
    nums = (argnums,) if single else tuple(argnums)

    def wrapped(*args):
        for n in nums:
            if not -len(args) <= n < len(args):
                raise ValueError(
                    f"argnums={argnums} is out of range for {len(args)} "
                    "positional arguments."
                )
        chosen = tuple(args[n] for n in nums)

        def partial(*diff_args):
            full = list(args)
            for n, a in zip(nums, diff_args):
                full[n] = a
            return fn(*full)

        result = vjp(partial, *chosen, has_aux=has_aux)
        out, back = result[0], result[1]
        _check_scalar(out)
        grads = back(ad_util.scalar(1, out.dtype))
        value = (out, result[2]) if has_aux else out
        return value, grads[0] if single else tuple(grads)

    return wrapped


def grad(fn, argnums=0, has_aux=False):
    """The gradient of the float-scalar function fn (see value_and_grad);
    with has_aux returns (gradient, aux)."""
    vg = value_and_grad(fn, argnums=argnums, has_aux=has_aux)

    def wrapped(*args):
        value, grads = vg(*args)
        if has_aux:
            return grads, value[1]
        return grads

    return wrapped
