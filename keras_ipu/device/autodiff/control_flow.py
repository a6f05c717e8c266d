"""Gradient rules of the control-flow primitives (primitives/control_flow.py)
and of host regions (primitives/host_transfer.py): primitives running sub-graphs.

Control flow differentiates into control flow: the backward pass of a cond
is a cond over per-branch backward graphs, the backward pass of a scan is a
reverse scan. The sub-graphs are differentiated with the autodiff's own
machinery (reverse.py): so these rules are the autodiff's, registered when
it is imported (autodiff/__init__.py), not with the other primitives'.

cond and scan also have a `residual_grad` pair: when the autodiff evaluates
such a node itself, it stores the values the backward pass needs (the
taken branch's, each step's) instead of recomputing them.
"""

from keras_ipu.device.autodiff.reverse import graph_vjp
from keras_ipu.device.autodiff.reverse import instantiate
from keras_ipu.device.autodiff.reverse import linearize
from keras_ipu.device.autodiff.reverse import restore
from keras_ipu.device.interpreter import eval_graph
from keras_ipu.device.ir import ShapedArray
from keras_ipu.device.ir import Var
from keras_ipu.device.primitives import ad_util
from keras_ipu.device.primitives.control_flow import cond_p
from keras_ipu.device.primitives.control_flow import custom_vjp_p
from keras_ipu.device.primitives.control_flow import optimization_barrier_p
from keras_ipu.device.primitives.control_flow import remat_p
from keras_ipu.device.primitives.control_flow import scan_p
from keras_ipu.device.primitives.control_flow import while_p
from keras_ipu.device.primitives.host_transfer import host_region_p
from keras_ipu.device.trace import Tracer
from keras_ipu.device.trace import trace_flat


def _diff(aval):
    return ad_util.is_differentiable(aval.dtype)


def _trace_aligned(fns, in_avals):
    """Trace every fn over in_avals; all graphs take the union of their
    captures (same order). Returns (graphs, captures)."""
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
    lin = linearize(graph, list(args))
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
                in_cts = graph_vjp(branch, ops, out_cts)
            else:
                info, start = residuals.infos[i], residuals.offsets[i]
                env = dict(info["constants"])
                env.update(zip(info["ids"],
                               stored_now[start:start + len(info["ids"])]))
                for var, value in zip(branch.inputs, ops):
                    env[var.id] = value
                in_cts = restore(branch, env).backward(out_cts)
            return [instantiate(in_cts[k], ops[k]) for k in live_in]

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
    body, n_carry, n_xs = params["body"], params["n_carry"], params["n_xs"]
    carry_avals, x_avals, const_avals = _scan_body_avals(inputs, n_carry, n_xs)
    box = {}

    def with_residuals(*args):
        lin = linearize(body, list(args))
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
        in_cts = restore(body, env).backward(out_cts)
        new_c = [instantiate(in_cts[i], carry_t[i]) for i in d_carry]
        new_k = [
            ad_util.add_any(acc, in_cts[n_carry + n_xs + i])
            for acc, i in zip(k_acc, d_consts)
        ]
        x_ct = [instantiate(in_cts[n_carry + i], x_t[i]) for i in d_xs]
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
    init = [instantiate(cts[i], carry[i]) for i in d_carry]
    init += [ad_util.zeros_like(consts[i]) for i in d_consts]
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
    return _region_grad(cts, inputs, graph, lambda ops, bwd, caps: remat_p.bind(
        *ops, *caps, graph=bwd))


def _host_region_grad(cts, inputs, outputs, *, graph, name):
    """The backward pass of host code runs on the host too: a host region
    whose graph is the vjp of `graph` (the effect token, operand and result
    0, passes through and gets no cotangent)."""
    def bind(ops, bwd, caps):
        if caps:
            raise AssertionError("the backward graph of a host region captured values")
        return host_region_p.bind(*ops, graph=bwd, name=f"{name}/grad")[1:]
    return _region_grad(cts, inputs, graph, bind, token=True)


def _region_grad(cts, inputs, graph, bind, token=False):
    """The gradient of a region running `graph` on its operands, as a region
    running the vjp of `graph`: bind(operands, backward graph, captures)
    gives the cotangents of the differentiable inputs. With `token`, operand
    and result 0 are an effect token that the backward region threads."""
    first = 1 if token else 0
    live_out = [i for i, c in enumerate(cts) if c is not None and i >= first]
    live_in = [i for i, x in enumerate(inputs) if i >= first and _diff(_aval_of(x))]
    n = len(inputs)

    def fn(*args):
        ops, live_cts = list(args[:n]), args[n:]
        out_cts = [None] * len(graph.outputs)
        for i, c in zip(live_out, live_cts):
            out_cts[i] = c
        in_cts = graph_vjp(graph, ops, out_cts)
        return ops[:first] + [instantiate(in_cts[i], ops[i]) for i in live_in]

    avals = [_aval_of(x) for x in inputs] + [_aval_of(cts[i]) for i in live_out]
    bwd, caps = trace_flat(fn, avals)
    outs = bind(list(inputs) + [cts[i] for i in live_out], bwd, caps)
    result = [None] * n
    for i, o in zip(live_in, outs):
        result[i] = o
    return result


def _custom_vjp_grad(cts, inputs, outputs, *, fwd, bwd, n_outputs, n_args,
                     bwd_nonzero):
    residuals = outputs[n_outputs:]
    out_cts = [instantiate(c, o)
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
host_region_p.grad = _host_region_grad


