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

Kernels run the sub-graphs with the graph interpreter. Their gradient
rules differentiate the sub-graphs, so they are the autodiff's own
(autodiff/control_flow.py).
"""

import numpy as np

from keras_ipu.device.interpreter import eval_graph
from keras_ipu.device.ir import ShapedArray
from keras_ipu.device.primitives import cost_util as _cost
from keras_ipu.device.primitives.registry import Primitive
from keras_ipu.device.primitives.shape_rules import ShapeError
from keras_ipu.device.simulator import cost_model as _cost_model
from keras_ipu.device.simulator import loop_trips as _loop_trips


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
                   subgraph_operands=_in_order("body"), carry_count=_scan_carry_count,
                   carries_in_place=True)


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
    "optimization_barrier", _barrier_rule, _barrier, multiple_results=True,
    aliases_operands=True,
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


# -- cost rules (formulas and constants: keras_ipu/device/simulator/cost_model.py)
# The cost of control flow is the cost of its sub-graphs: one branch of a
# cond (the costliest is counted), `length` scan bodies, a while loop's body
# as many times as it runs when that can be counted from the program (a
# Poplar Repeat: no condition; simulator/loop_trips.py), else its body
# WHILE_LOOP_ASSUMED_TRIPS times and its condition once more.


def _cond_cost(ins, outs, *, branches):
    parts = [_cost.part(1, b) for b in branches]
    return _cost.control(ins, outs, "cond", parts, combine="max")


def _while_cost(ins, outs, *, cond_graph, body_graph, n_cond_consts, operands=None):
    trips = None if operands is None else _loop_trips.known_trips(
        operands, cond_graph, body_graph, n_cond_consts)
    if trips is not None:
        return _cost.control(ins, outs, "loop", [_cost.part(trips, body_graph)])
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
while_p.cost_reads_operands = True
scan_p.cost = _scan_cost
stop_gradient_p.cost = _cost.view
optimization_barrier_p.cost = _cost.view
remat_p.cost = _call_cost
custom_vjp_p.cost = _custom_vjp_cost
