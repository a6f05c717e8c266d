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


def _cond_operands(params):
    # Every branch takes the operands after the index.
    n = len(params["branches"][0].inputs)
    return [tuple(range(1, 1 + n))] * len(params["branches"])


cond_p = Primitive("cond", _cond_rule, _cond, multiple_results=True,
                   subgraph_params=("branches",), result_graphs=("branches",),
                   subgraph_operands=_cond_operands)


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


def _while_carry_count(params):
    return len(params["cond_graph"].inputs) - params["n_cond_consts"]


def _while_operands(params):
    n_carry, n_cond = _while_carry_count(params), params["n_cond_consts"]
    n_body = len(params["body_graph"].inputs) - n_carry
    carry = tuple(range(n_carry))
    return [carry + tuple(range(n_carry + n_cond, n_carry + n_cond + n_body)),
            carry + tuple(range(n_carry, n_carry + n_cond))]


while_p = Primitive("while_loop", _while_rule, _while, multiple_results=True,
                    subgraph_params=("body_graph", "cond_graph"),
                    result_graphs=("body_graph",), subgraph_operands=_while_operands,
                    carry_count=_while_carry_count)


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


def _scan_carry_count(params):
    return params["n_carry"]


def _in_order(graph_param):
    """subgraph_operands of a primitive whose one sub-graph takes its
    operands in order (a scan body takes slices of the xs)."""

    def operands(params):
        return [tuple(range(len(params[graph_param].inputs)))]

    return operands


scan_p = Primitive("scan", _scan_rule, _scan, multiple_results=True,
                   subgraph_params=("body",), result_graphs=("body",),
                   subgraph_operands=_in_order("body"), carry_count=_scan_carry_count)


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


remat_p = Primitive("remat", _call_rule, _call, multiple_results=True,
                    subgraph_params=("graph",), result_graphs=("graph",),
                    subgraph_operands=_in_order("graph"))


def _custom_vjp_rule(*operands, fwd, bwd, n_outputs, n_args, bwd_nonzero):
    _check_inputs(fwd, operands, "custom_gradient forward")
    return tuple(_avals(fwd.outputs))


def _custom_vjp(*operands, fwd, bwd, n_outputs, n_args, bwd_nonzero):
    return _host(eval_graph(fwd, *operands))


custom_vjp_p = Primitive(
    "custom_vjp", _custom_vjp_rule, _custom_vjp, multiple_results=True,
    subgraph_params=("fwd", "bwd"), result_graphs=("fwd",),
    subgraph_operands=lambda params: [_in_order("fwd")(params)[0], None],
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
    # Called without stored residuals: each backward branch recomputes its
    # branch's forward values.
    return _cond_backward(cts, inputs, branches, None)


def _with_residuals(graph, args, box):
    """graph's outputs on args, then the traced values of its nodes (the
    residuals); box records their Var ids, avals and the constant ones."""
    from keras_ipu.device import autodiff
    from keras_ipu.device.trace import Tracer

    lin = autodiff.linearize(graph, list(args))
    ids, values, constants = [], [], {}
    for node in graph.nodes:
        for v in node.outputs:
            value = lin.env[v.id]
            if isinstance(value, Tracer):
                ids.append(v.id)
                values.append(value)
            else:
                constants[v.id] = value
    box.update(ids=ids, avals=[_aval_of(v) for v in values],
               constants=constants)
    return list(lin.outputs) + values


class CondResiduals:
    """The values every branch of a cond stored for its backward branch:
    one slot list per branch, laid end to end (a branch that did not run
    leaves zeros in the other branches' slots)."""

    def __init__(self, values, infos, offsets):
        self.values = values
        self.infos = infos
        self.offsets = offsets


def cond_forward_with_residuals(inputs, params):
    """Run the cond and store the taken branch's values: (outputs,
    CondResiduals or None when a residual's shape is unknown)."""
    from keras_ipu.device.primitives import ad_util
    from keras_ipu.device.trace import trace_flat

    branches = params["branches"]
    index, operands = inputs[0], list(inputs[1:])
    in_avals = [_aval_of(x) for x in operands]
    infos = []
    for branch in branches:
        box = {}
        trace_flat(lambda *a, b=branch, box=box: _with_residuals(b, a, box),
                   in_avals)
        infos.append(box)
    if any(not a.is_static() for info in infos for a in info["avals"]):
        outs = cond_p.bind(*inputs, **params)
        return list(outs), None
    offsets, total = [], 0
    for info in infos:
        offsets.append(total)
        total += len(info["ids"])

    def padded(i):
        def fn(*args):
            box = {}
            outs = _with_residuals(branches[i], args, box)
            n_out = len(branches[i].outputs)
            stored = []
            for j, info in enumerate(infos):
                if j == i:
                    stored += outs[n_out:]
                else:
                    stored += [ad_util.zeros_like(a) for a in info["avals"]]
            return outs[:n_out] + stored

        return fn

    graphs, captures = _trace_aligned(
        [padded(i) for i in range(len(branches))], in_avals)
    outs = cond_p.bind(index, *operands, *captures, branches=tuple(graphs))
    n_out = len(branches[0].outputs)
    return list(outs[:n_out]), CondResiduals(
        list(outs[n_out:]), infos, offsets)


def cond_grad_with_residuals(cts, inputs, outputs, residuals, *, branches):
    return _cond_backward(cts, inputs, branches, residuals)


def _cond_backward(cts, inputs, branches, residuals):
    """A cond over per-branch backward graphs: each takes the operands,
    the stored values (if any) and the live output cotangents, and returns
    the cotangents of the differentiable operands."""
    from keras_ipu.device import autodiff

    index, operands = inputs[0], inputs[1:]
    live_out = [i for i, c in enumerate(cts) if c is not None]
    live_in = [i for i, x in enumerate(operands) if _diff(_aval_of(x))]
    if not live_in:
        return [None] * len(inputs)
    n_ops = len(operands)
    stored = [] if residuals is None else residuals.values
    n_stored = len(stored)

    def backward(i, branch):
        def fn(*args):
            ops = list(args[:n_ops])
            stored_now = args[n_ops:n_ops + n_stored]
            live_cts = args[n_ops + n_stored:]
            out_cts = [None] * len(branch.outputs)
            for k, c in zip(live_out, live_cts):
                out_cts[k] = c
            if residuals is None:
                in_cts = autodiff.graph_vjp(branch, ops, out_cts)
            else:
                info, start = residuals.infos[i], residuals.offsets[i]
                env = dict(info["constants"])
                env.update(zip(info["ids"],
                               stored_now[start:start + len(info["ids"])]))
                for var, value in zip(branch.inputs, ops):
                    env[var.id] = value
                in_cts = autodiff.restore(branch, env).backward(out_cts)
            return [autodiff.instantiate(in_cts[k], ops[k]) for k in live_in]

        return fn

    in_avals = (
        [_aval_of(x) for x in operands]
        + [_aval_of(v) for v in stored]
        + [_aval_of(cts[i]) for i in live_out]
    )
    graphs, captures = _trace_aligned(
        [backward(i, b) for i, b in enumerate(branches)], in_avals)
    outs = cond_p.bind(index, *operands, *stored,
                       *(cts[i] for i in live_out), *captures,
                       branches=tuple(graphs))
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


def _split_scan(inputs, n_carry, n_xs):
    return (list(inputs[:n_carry]), list(inputs[n_carry:n_carry + n_xs]),
            list(inputs[n_carry + n_xs:]))


def _scan_body_avals(inputs, n_carry, n_xs):
    carry, xs, consts = _split_scan(inputs, n_carry, n_xs)
    return ([_aval_of(c) for c in carry],
            [ShapedArray(x.shape[1:], x.dtype) for x in xs],
            [_aval_of(c) for c in consts])


class ScanResiduals:
    """What the forward scan stored for the reverse scan: per step, the
    carry it started from and every traced value of the body (stacked on
    a leading axis); values of the body that were constants are kept as
    they are."""

    def __init__(self, carries, values, value_ids, constants):
        self.carries = carries
        self.values = values
        self.value_ids = value_ids
        self.constants = constants


def scan_forward_with_residuals(inputs, params):
    """Run the scan and store its residuals: (outputs, ScanResiduals)."""
    from keras_ipu.device import autodiff
    from keras_ipu.device.trace import Tracer
    from keras_ipu.device.trace import trace_flat

    body, n_carry, n_xs = params["body"], params["n_carry"], params["n_xs"]
    carry_avals, x_avals, const_avals = _scan_body_avals(inputs, n_carry, n_xs)
    box = {}

    def with_residuals(*args):
        lin = autodiff.linearize(body, list(args))
        traced, constants = [], {}
        for node in body.nodes:
            for v in node.outputs:
                value = lin.env[v.id]
                if isinstance(value, Tracer):
                    traced.append((v.id, value))
                else:
                    constants[v.id] = value
        box["ids"] = [i for i, _ in traced]
        box["constants"] = constants
        return (list(lin.outputs) + list(args[:n_carry])
                + [value for _, value in traced])

    res_body, res_caps = trace_flat(
        with_residuals, carry_avals + x_avals + const_avals)
    outs = scan_p.bind(*inputs, *res_caps, **dict(params, body=res_body))
    n_out = len(body.outputs)
    carries = list(outs[n_out:n_out + n_carry])
    values = list(outs[n_out + n_carry:])
    return list(outs[:n_out]), ScanResiduals(
        carries, values, box["ids"], box["constants"])


def scan_grad_with_residuals(cts, inputs, outputs, residuals, *, body, length,
                             reverse, n_carry, n_xs, unroll):
    """The reverse scan: carry = (carry cotangents, sums of the const
    cotangents); xs = (stored carries, xs, stored body values, ys
    cotangents); consts = consts. Each step runs the body's backward pass
    on the stored values (nothing is recomputed)."""
    from keras_ipu.device import autodiff
    from keras_ipu.device.trace import trace_flat

    carry, xs, consts = _split_scan(inputs, n_carry, n_xs)
    carry_avals, x_avals, const_avals = _scan_body_avals(inputs, n_carry, n_xs)
    d_carry = [i for i, a in enumerate(carry_avals) if _diff(a)]
    d_xs = [i for i, a in enumerate(x_avals) if _diff(a)]
    d_consts = [i for i, a in enumerate(const_avals) if _diff(a)]
    ys_cts = cts[n_carry:]
    live_ys = [i for i, c in enumerate(ys_cts) if c is not None]
    if not (d_xs or d_consts or d_carry):
        return [None] * len(inputs)
    stored = residuals.values
    n_stored = len(stored)

    def step(*args):
        it = iter(args)
        c_ct = [next(it) for _ in d_carry]
        k_acc = [next(it) for _ in d_consts]
        carry_t = [next(it) for _ in range(n_carry)]
        x_t = [next(it) for _ in range(n_xs)]
        stored_t = [next(it) for _ in range(n_stored)]
        y_ct = [next(it) for _ in live_ys]
        k = [next(it) for _ in range(len(consts))]
        out_cts = [None] * len(body.outputs)
        for i, c in zip(d_carry, c_ct):
            out_cts[i] = c
        for i, c in zip(live_ys, y_ct):
            out_cts[n_carry + i] = c
        env = dict(residuals.constants)
        env.update(zip(residuals.value_ids, stored_t))
        for var, value in zip(body.inputs, carry_t + x_t + k):
            env[var.id] = value
        in_cts = autodiff.restore(body, env).backward(out_cts)
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
        + [ShapedArray(v.shape[1:], v.dtype) for v in stored]
        + [ShapedArray(ys_cts[i].shape[1:], ys_cts[i].dtype) for i in live_ys]
        + const_avals
    )
    bwd_body, bwd_caps = trace_flat(step, bwd_avals)
    init = [autodiff.instantiate(cts[i], carry[i]) for i in d_carry]
    init += [autodiff.ad_util.zeros_like(consts[i]) for i in d_consts]
    n_bwd_carry = len(init)
    outs = scan_p.bind(
        *init, *residuals.carries, *xs, *stored,
        *(ys_cts[i] for i in live_ys), *consts, *bwd_caps,
        body=bwd_body, length=length, reverse=not reverse,
        n_carry=n_bwd_carry, n_xs=n_carry + n_xs + n_stored + len(live_ys),
        unroll=unroll)
    result = [None] * len(inputs)
    for j, i in enumerate(d_carry):
        result[i] = outs[j]
    for j, i in enumerate(d_consts):
        result[n_carry + n_xs + i] = outs[len(d_carry) + j]
    for j, i in enumerate(d_xs):
        result[n_carry + i] = outs[n_bwd_carry + j]
    return result


def _scan_grad(cts, inputs, outputs, **params):
    # Called without stored residuals (the autodiff stores them when it
    # runs the forward pass itself): the forward scan runs again.
    _, residuals = scan_forward_with_residuals(inputs, params)
    return scan_grad_with_residuals(cts, inputs, outputs, residuals, **params)


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
cond_p.residual_grad = (cond_forward_with_residuals, cond_grad_with_residuals)
while_p.grad = _while_grad
scan_p.grad = _scan_grad
scan_p.residual_grad = (scan_forward_with_residuals, scan_grad_with_residuals)
optimization_barrier_p.grad = _barrier_grad
remat_p.grad = _remat_grad
custom_vjp_p.grad = _custom_vjp_grad


# -- cost rules (formulas and constants: keras_ipu/device/simulator/cost_model.py)
# The cost of control flow is the cost of its sub-graphs: one branch of a
# cond (the costliest is counted), `length` scan bodies, a while loop's body
# WHILE_LOOP_ASSUMED_TRIPS times (its trip count is only known at run time).
from keras_ipu.device.primitives import cost_util as _cost  # noqa: E402
from keras_ipu.device.simulator import cost_model as _cost_model  # noqa: E402


def _cond_cost(ins, outs, *, branches):
    parts = [_cost.part(1, b) for b in branches]
    return _cost.control(ins, outs, "cond", parts, combine="max")


def _while_cost(ins, outs, *, cond_graph, body_graph, n_cond_consts):
    trips = _cost_model.WHILE_LOOP_ASSUMED_TRIPS
    parts = [_cost.part(trips, body_graph), _cost.part(trips + 1, cond_graph)]
    return _cost.control(ins, outs, "loop", parts)


def _scan_cost(ins, outs, *, body, length, reverse, n_carry, n_xs, unroll):
    if length is None:  # known from the xs once shapes are static
        xs = ins[n_carry:n_carry + n_xs]
        length = (xs[0].shape[0] or 0) if xs else 0
    return _cost.control(ins, outs, "loop", [_cost.part(length, body)])


def _call_cost(ins, outs, *, graph):
    return _cost.control(ins, outs, "call", [_cost.part(1, graph)])


def _custom_vjp_cost(ins, outs, *, fwd, **params):
    return _cost.control(ins, outs, "call", [_cost.part(1, fwd)])


cond_p.cost = _cond_cost
while_p.cost = _while_cost
scan_p.cost = _scan_cost
stop_gradient_p.cost = _cost.view
optimization_barrier_p.cost = _cost.view
remat_p.cost = _call_cost
custom_vjp_p.cost = _custom_vjp_cost
