"""Control-flow primitives (as jax.lax has them), with sub-Graphs as params.

Every sub-graph takes its explicit inputs first, then the values it captured
from the enclosing trace (see trace.GraphBuilder); the primitive's operands
carry those captured values after the explicit ones.

- cond(index, *operands; branches): runs branches[clip(index)] on operands.
  Every branch graph takes the same operands (the union of all captures).
- while_loop(*carry, *cond_consts, *body_consts; cond_graph, body_graph,
  n_cond_consts): cond_graph(*carry, *cond_consts) -> scalar bool,
  body_graph(*carry, *body_consts) -> new carry.
- scan(*carry, *xs, *consts; body, length, reverse, n_carry, n_xs, unroll):
  body(*carry, *x_t, *consts) -> (*new_carry, *y_t); returns the final
  carry and the y_t stacked on a new leading axis of size `length` (None
  while unknown: the kernel takes it from xs). `unroll` is the compiler's
  hint: steps per loop iteration, 0 for a full unroll.
- stop_gradient(x): identity whose gradient is zero.
- optimization_barrier(*xs): identity that passes must not look through
  (recomputation boundaries).
- remat(*args; graph): runs graph; marks a region whose activations are
  recomputed in the backward pass instead of stored.
- custom_vjp(*args; fwd, bwd, n_outputs, ...): runs fwd, which returns the
  outputs then the residuals the user's gradient function closes over;
  bwd(*output_cotangents, *residuals) gives the input cotangents.

Kernels run the sub-graphs with the graph interpreter.
"""

import numpy as np

from keras_ipu.device.interpreter import eval_graph
from keras_ipu.device.ir import ShapedArray
from keras_ipu.device.primitives.registry import Primitive
from keras_ipu.device.primitives.shape_rules import ShapeError


def _avals(vars_):
    return [v.aval for v in vars_]


def _fmt(avals):
    return "(" + ", ".join(a.short() for a in avals) + ")"


def join_aval(a, b, what):
    """The aval both a and b satisfy: unknown (None) dims are compatible with
    anything and stay unknown; known dims and dtypes must agree."""
    if a.dtype != b.dtype:
        raise ShapeError(
            f"{what}: dtype {a.dtype.name} differs from {b.dtype.name} "
            f"({a.short()} vs {b.short()}). Cast one of them so both have the "
            "same dtype."
        )
    if a.ndim != b.ndim:
        raise ShapeError(
            f"{what}: rank {a.ndim} differs from rank {b.ndim} "
            f"({a.short()} vs {b.short()}). Both must have the same shape."
        )
    dims = []
    for x, y in zip(a.shape, b.shape):
        if x is None or y is None:
            dims.append(None)
        elif x != y:
            raise ShapeError(
                f"{what}: shape {a.shape} differs from {b.shape} "
                f"({a.short()} vs {b.short()}). Both must have the same shape."
            )
        else:
            dims.append(x)
    return ShapedArray(dims, a.dtype)


def join_avals(xs, ys, what):
    if len(xs) != len(ys):
        raise ShapeError(
            f"{what}: {len(xs)} values {_fmt(xs)} vs {len(ys)} values "
            f"{_fmt(ys)}. Both must return the same structure."
        )
    return [join_aval(x, y, f"{what}, value {i}") for i, (x, y) in
            enumerate(zip(xs, ys))]


def _check_inputs(graph, avals, what):
    join_avals(_avals(graph.inputs), list(avals), f"{what} inputs")


def _host(values):
    return tuple(np.asarray(v) for v in values)


# -- cond ---------------------------------------------------------------------


def _cond_rule(index, *operands, branches):
    if index.ndim != 0 or index.dtype.kind not in "iu":
        raise ShapeError(
            f"cond: the branch index must be an integer scalar, got "
            f"{index.short()}."
        )
    outs = None
    for i, branch in enumerate(branches):
        _check_inputs(branch, operands, f"cond branch {i}")
        avals = _avals(branch.outputs)
        outs = avals if outs is None else join_avals(
            outs, avals, f"cond: outputs of branch 0..{i - 1} vs branch {i}"
        )
    return tuple(outs)


def _cond(index, *operands, branches):
    i = int(np.clip(index, 0, len(branches) - 1))
    return _host(eval_graph(branches[i], *operands))


cond_p = Primitive("cond", _cond_rule, _cond, multiple_results=True)


# -- while_loop ---------------------------------------------------------------


def _split_while(operands, cond_graph, n_cond_consts):
    n_carry = len(cond_graph.inputs) - n_cond_consts
    carry = operands[:n_carry]
    cond_consts = operands[n_carry:n_carry + n_cond_consts]
    body_consts = operands[n_carry + n_cond_consts:]
    return carry, cond_consts, body_consts


def _while_rule(*operands, cond_graph, body_graph, n_cond_consts):
    carry, cond_consts, body_consts = _split_while(
        operands, cond_graph, n_cond_consts
    )
    _check_inputs(cond_graph, carry + cond_consts, "while_loop cond")
    _check_inputs(body_graph, carry + body_consts, "while_loop body")
    (pred,) = _avals(cond_graph.outputs) or (None,)
    if pred is None or pred.dtype != np.bool_ or (
        pred.size is not None and pred.size != 1
    ):
        raise ShapeError(
            "while_loop: `cond` must return one boolean scalar, got "
            f"{pred.short() if pred is not None else 'nothing'}."
        )
    return tuple(
        join_avals(
            list(carry), _avals(body_graph.outputs),
            "while_loop: loop variables vs the values `body` returns",
        )
    )


def _while(*operands, cond_graph, body_graph, n_cond_consts):
    carry, cond_consts, body_consts = _split_while(
        operands, cond_graph, n_cond_consts
    )
    carry = tuple(carry)
    while bool(np.asarray(eval_graph(cond_graph, *carry, *cond_consts)[0])):
        carry = tuple(eval_graph(body_graph, *carry, *body_consts))
    return _host(carry)


while_p = Primitive("while_loop", _while_rule, _while, multiple_results=True)


# -- scan ---------------------------------------------------------------------


def _scan_rule(*operands, body, length, reverse, n_carry, n_xs, unroll):
    carry = operands[:n_carry]
    xs = operands[n_carry:n_carry + n_xs]
    consts = operands[n_carry + n_xs:]
    for i, x in enumerate(xs):
        if x.ndim == 0:
            raise ShapeError(
                f"scan: xs value {i} is a scalar {x.short()}; every xs value "
                "needs a leading axis to scan over."
            )
        if x.shape[0] is not None and length is not None and x.shape[0] != length:
            raise ShapeError(
                f"scan: xs value {i} {x.short()} has leading size "
                f"{x.shape[0]}, but the scan length is {length}. Every xs "
                "value must have the same leading size."
            )
    x_slices = [ShapedArray(x.shape[1:], x.dtype) for x in xs]
    _check_inputs(body, list(carry) + x_slices + list(consts), "scan body")
    outs = _avals(body.outputs)
    if len(outs) < n_carry:
        raise ShapeError(
            f"scan: the body returns {len(outs)} values but the carry has "
            f"{n_carry}."
        )
    new_carry = join_avals(
        list(carry), outs[:n_carry],
        "scan: the carry `init` vs the carry `f` returns",
    )
    ys = [ShapedArray((length,) + y.shape, y.dtype) for y in outs[n_carry:]]
    return tuple(new_carry + ys)


def _scan(*operands, body, length, reverse, n_carry, n_xs, unroll):
    carry = tuple(operands[:n_carry])
    xs = operands[n_carry:n_carry + n_xs]
    consts = operands[n_carry + n_xs:]
    if length is None:
        length = xs[0].shape[0]
    steps = range(length - 1, -1, -1) if reverse else range(length)
    ys = []
    for t in steps:
        outs = eval_graph(body, *carry, *(x[t] for x in xs), *consts)
        carry = tuple(outs[:n_carry])
        ys.append(_host(outs[n_carry:]))
    if reverse:
        ys.reverse()
    n_ys = len(body.outputs) - n_carry
    if ys:
        stacked = [np.stack([y[k] for y in ys]) for k in range(n_ys)]
    else:
        stacked = [
            np.zeros((0,) + tuple(d or 0 for d in v.aval.shape), v.aval.dtype)
            for v in body.outputs[n_carry:]
        ]
    return _host(carry) + tuple(stacked)


scan_p = Primitive("scan", _scan_rule, _scan, multiple_results=True)


# -- gradient control ---------------------------------------------------------


def _identity_rule(x):
    return x


def _identity(x):
    return x


# The gradient of stop_gradient is zero by definition: autodiff sends no
# cotangent through it (nondiff is the marker it reads).
stop_gradient_p = Primitive(
    "stop_gradient",
    _identity_rule,
    _identity,
    nondiff="stop_gradient: gradients are blocked here by definition (zero)",
)


def _barrier_rule(*xs):
    return tuple(xs)


def _barrier(*xs):
    return tuple(xs)


optimization_barrier_p = Primitive(
    "optimization_barrier", _barrier_rule, _barrier, multiple_results=True
)


def _call_rule(*operands, graph):
    _check_inputs(graph, operands, "remat")
    return tuple(_avals(graph.outputs))


def _call(*operands, graph):
    return _host(eval_graph(graph, *operands))


remat_p = Primitive("remat", _call_rule, _call, multiple_results=True)


def _custom_vjp_rule(*operands, fwd, bwd, n_outputs, n_args, bwd_nonzero):
    _check_inputs(fwd, operands, "custom_gradient forward")
    return tuple(_avals(fwd.outputs))


def _custom_vjp(*operands, fwd, bwd, n_outputs, n_args, bwd_nonzero):
    return _host(eval_graph(fwd, *operands))


custom_vjp_p = Primitive(
    "custom_vjp", _custom_vjp_rule, _custom_vjp, multiple_results=True
)


# -- gradient rules (contract: keras_ipu/device/autodiff.py) -----------------
# Control flow differentiates into control flow: the backward pass of a cond
# is a cond over per-branch backward graphs, the backward pass of a scan is
# a reverse scan. The sub-graphs are traced with the autodiff's graph_vjp,
# which recomputes each branch's (step's) forward values inside the
# backward graph.


def _diff(aval):
    from keras_ipu.device.primitives import ad_util

    return ad_util.is_differentiable(aval.dtype)


def _trace_aligned(fns, in_avals):
    """Trace every fn over in_avals; all graphs take the union of their
    captures (same order). Returns (graphs, captures)."""
    from keras_ipu.device.ir import Var
    from keras_ipu.device.trace import trace_flat

    traced = [trace_flat(fn, in_avals) for fn in fns]
    union, seen = [], set()
    for _, caps in traced:
        for c in caps:
            if id(c.var) not in seen:
                seen.add(id(c.var))
                union.append(c)
    graphs = []
    n = len(in_avals)
    for graph, caps in traced:
        own = {id(c.var): v for c, v in zip(caps, graph.inputs[n:])}
        graph.inputs = graph.inputs[:n] + [
            own.get(id(c.var)) or Var(c.aval) for c in union
        ]
        graphs.append(graph)
    return graphs, union


def _cond_grad(cts, inputs, outputs, *, branches):
    from keras_ipu.device import autodiff

    index, operands = inputs[0], inputs[1:]
    live_out = [i for i, c in enumerate(cts) if c is not None]
    live_in = [i for i, x in enumerate(operands) if _diff(_aval_of(x))]
    if not live_in:
        return [None] * len(inputs)
    n_ops = len(operands)

    def backward(branch):
        def fn(*args):
            ops, live_cts = args[:n_ops], args[n_ops:]
            out_cts = [None] * len(branch.outputs)
            for i, c in zip(live_out, live_cts):
                out_cts[i] = c
            in_cts = autodiff.graph_vjp(branch, list(ops), out_cts)
            return [autodiff.instantiate(in_cts[i], ops[i]) for i in live_in]

        return fn

    in_avals = [ShapedArray(x.shape, x.dtype) for x in operands] + [
        ShapedArray(cts[i].shape, cts[i].dtype) for i in live_out
    ]
    graphs, captures = _trace_aligned(
        [backward(b) for b in branches], in_avals)
    outs = cond_p.bind(index, *operands, *(cts[i] for i in live_out),
                       *captures, branches=tuple(graphs))
    result = [None] * len(inputs)
    for i, o in zip(live_in, outs):
        result[1 + i] = o
    return result


def _while_grad(cts, inputs, outputs, **params):
    raise NotImplementedError(
        "while_loop is not reverse-differentiable: its trip count is only "
        "known when it runs, so its steps cannot be stored and replayed "
        "backwards. Use fori_loop with static (Python int) bounds or scan "
        "(both become a scan), or stop_gradient on the loop's inputs."
    )


def _aval_of(x):
    return ShapedArray(x.shape, x.dtype)


def _scan_grad(cts, inputs, outputs, *, body, length, reverse, n_carry, n_xs,
               unroll):
    from keras_ipu.device import autodiff
    from keras_ipu.device.trace import trace_flat

    carry = list(inputs[:n_carry])
    xs = list(inputs[n_carry:n_carry + n_xs])
    consts = list(inputs[n_carry + n_xs:])
    n_ys = len(outputs) - n_carry
    carry_avals = [_aval_of(c) for c in carry]
    x_avals = [ShapedArray(x.shape[1:], x.dtype) for x in xs]
    const_avals = [_aval_of(c) for c in consts]
    body_avals = carry_avals + x_avals + const_avals

    # 1. Forward again, also stacking the carry each step starts from: the
    #    residuals of the reverse scan.
    def with_carries(*args):
        outs = eval_graph(body, *args)
        return list(outs) + list(args[:n_carry])

    res_body, res_caps = trace_flat(with_carries, body_avals)
    res = scan_p.bind(
        *carry, *xs, *consts, *res_caps, body=res_body, length=length,
        reverse=reverse, n_carry=n_carry, n_xs=n_xs, unroll=unroll)
    carries = list(res[n_carry + n_ys:])

    # 2. The reverse scan: carry = (carry cotangents, const cotangent sums);
    #    xs = (stacked carries, xs, ys cotangents); consts = consts.
    d_carry = [i for i, a in enumerate(carry_avals) if _diff(a)]
    d_xs = [i for i, a in enumerate(x_avals) if _diff(a)]
    d_consts = [i for i, a in enumerate(const_avals) if _diff(a)]
    ys_cts = cts[n_carry:]
    live_ys = [i for i, c in enumerate(ys_cts) if c is not None]
    if not (d_xs or d_consts or d_carry):
        return [None] * len(inputs)

    def step(*args):
        it = iter(args)
        c_ct = [next(it) for _ in d_carry]
        k_acc = [next(it) for _ in d_consts]
        carry_t = [next(it) for _ in range(n_carry)]
        x_t = [next(it) for _ in range(n_xs)]
        y_ct = [next(it) for _ in live_ys]
        k = [next(it) for _ in range(len(consts))]
        out_cts = [None] * len(body.outputs)
        for i, c in zip(d_carry, c_ct):
            out_cts[i] = c
        for i, c in zip(live_ys, y_ct):
            out_cts[n_carry + i] = c
        in_cts = autodiff.graph_vjp(body, carry_t + x_t + k, out_cts)
        new_c = [autodiff.instantiate(in_cts[i], carry_t[i]) for i in d_carry]
        new_k = [
            autodiff.ad_util.add_any(acc, in_cts[n_carry + n_xs + i])
            for acc, i in zip(k_acc, d_consts)
        ]
        x_ct = [autodiff.instantiate(in_cts[n_carry + i], x_t[i]) for i in d_xs]
        return new_c + new_k + x_ct

    bwd_avals = (
        [carry_avals[i] for i in d_carry]
        + [const_avals[i] for i in d_consts]
        + carry_avals + x_avals
        + [ShapedArray(ys_cts[i].shape[1:], ys_cts[i].dtype) for i in live_ys]
        + const_avals
    )
    bwd_body, bwd_caps = trace_flat(step, bwd_avals)
    init = [autodiff.instantiate(cts[i], carry[i]) for i in d_carry]
    init += [autodiff.ad_util.zeros_like(consts[i]) for i in d_consts]
    n_bwd_carry = len(init)
    outs = scan_p.bind(
        *init, *carries, *xs, *(ys_cts[i] for i in live_ys), *consts,
        *bwd_caps, body=bwd_body, length=length, reverse=not reverse,
        n_carry=n_bwd_carry, n_xs=n_carry + n_xs + len(live_ys),
        unroll=unroll)
    result = [None] * len(inputs)
    for j, i in enumerate(d_carry):
        result[i] = outs[j]
    for j, i in enumerate(d_consts):
        result[n_carry + n_xs + i] = outs[len(d_carry) + j]
    for j, i in enumerate(d_xs):
        result[n_carry + i] = outs[n_bwd_carry + j]
    return result


def _barrier_grad(cts, inputs, outputs):
    return list(cts)


def _remat_grad(cts, inputs, outputs, *, graph):
    # The forward values of the region are recomputed in the backward pass
    # (not stored): the backward graph is itself a remat region.
    from keras_ipu.device import autodiff

    live_out = [i for i, c in enumerate(cts) if c is not None]
    live_in = [i for i, x in enumerate(inputs) if _diff(_aval_of(x))]
    n = len(inputs)

    def fn(*args):
        ops, live_cts = list(args[:n]), args[n:]
        out_cts = [None] * len(graph.outputs)
        for i, c in zip(live_out, live_cts):
            out_cts[i] = c
        in_cts = autodiff.graph_vjp(graph, ops, out_cts)
        return [autodiff.instantiate(in_cts[i], ops[i]) for i in live_in]

    from keras_ipu.device.trace import trace_flat

    avals = [_aval_of(x) for x in inputs] + [_aval_of(cts[i]) for i in live_out]
    bwd, caps = trace_flat(fn, avals)
    outs = remat_p.bind(*inputs, *(cts[i] for i in live_out), *caps,
                        graph=bwd)
    result = [None] * n
    for i, o in zip(live_in, outs):
        result[i] = o
    return result


def _custom_vjp_grad(cts, inputs, outputs, *, fwd, bwd, n_outputs, n_args,
                     bwd_nonzero):
    from keras_ipu.device import autodiff

    residuals = outputs[n_outputs:]
    out_cts = [autodiff.instantiate(c, o)
               for c, o in zip(cts[:n_outputs], outputs[:n_outputs])]
    grads = list(eval_graph(bwd, *out_cts, *residuals))
    result = [None] * len(inputs)
    for i, nonzero in enumerate(bwd_nonzero):
        if nonzero:
            result[i] = grads.pop(0)
    # Values the forward function closed over (captures) get no gradient:
    # the user's grad_fn defines the gradient of the explicit arguments.
    return result


cond_p.grad = _cond_grad
while_p.grad = _while_grad
scan_p.grad = _scan_grad
optimization_barrier_p.grad = _barrier_grad
remat_p.grad = _remat_grad
custom_vjp_p.grad = _custom_vjp_grad
