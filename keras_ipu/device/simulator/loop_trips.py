"""How many trips a while loop of a program runs, read from the program.

Graphcore's compiler turns a while loop whose trip count it can work out
into a Poplar Repeat of that count ([TFREPEAT] in cost_model.py:
WhileLoopToRepeatSimplify records the count, CreateRepeatOp lowers the
loop to `Repeat(count, body)`, so its condition never runs on the IPU); a
loop it cannot count stays a while loop, its condition run before every
trip. The count it finds is the one the program runs, so the cost model
counts the body that many times, and only the loops it cannot count fall
back to cost_model.WHILE_LOOP_ASSUMED_TRIPS.

What counts as countable here: the carries the condition reads (closed
over what the body computes them from) start as constants of the program,
and the body computes them with elementwise operations from themselves and
constants: the loop counters of `for _ in tf.range(n)` (the steps of a
tf.keras execution, a micro-batch loop, `loops.repeat(n, ...)`) with any
comparison and any step. The count is found by running the condition and
those few scalar operations until the condition fails (XLA's brute force
in while_loop_analysis, which Graphcore's pass calls), at most
cost_model.WHILE_LOOP_MAX_COUNTED_TRIPS trips. Anything else (a bound read
from an input or from the data, an effect, random bits) is not countable.
"""

import weakref

import numpy as np

from keras_ipu.device.ir import Literal
from keras_ipu.device.ir import subgraphs
from keras_ipu.device.simulator import cost_model

# Counters are scalars (XLA's and Poplar's induction variables are); a few
# more elements at most are run, never the data a loop carries.
_COUNTERS = 16

# cond graph -> {(id of body graph, control carries' start values): trips or None}
_MEMO = weakref.WeakKeyDictionary()


def known_trips(operands, cond_graph, body_graph, n_cond_consts):
    """The trip count of a while_loop node with these operands (Vars and
    Literals) and params, or None when it is not countable (module doc)."""
    n_carry = len(cond_graph.inputs) - n_cond_consts
    cond_consts = operands[n_carry:n_carry + n_cond_consts]
    body_consts = operands[n_carry + n_cond_consts:]
    control = _control_carries(cond_graph, body_graph, n_carry)
    if control is None or sum(operands[k].aval.size or 0 for k in control) > _COUNTERS:
        return None
    body_reads = _used_inputs(body_graph, _slice(body_graph, control),
                              [body_graph.outputs[k] for k in control])
    read = ([operands[k] for k in control]
            + [cond_consts[k - n_carry] for k in _used_inputs(cond_graph) if k >= n_carry]
            + [body_consts[k - n_carry] for k in body_reads if k >= n_carry])
    for operand in read:
        if type(operand) is not Literal:
            return None
    start = tuple((i, np.asarray(operands[i].value)) for i in sorted(control))
    key = (id(body_graph), tuple((i, v.dtype.str, v.tobytes()) for i, v in start))
    memo = _MEMO.setdefault(cond_graph, {})
    if key not in memo:
        try:
            memo[key] = _count(cond_graph, body_graph, n_carry, dict(start),
                               cond_consts, body_consts, control)
        except Exception:  # noqa: BLE001 - a kernel refusing the counters: not countable
            memo[key] = None
    return memo[key]


def _used_inputs(graph, nodes=None, outputs=None):
    """Indices of `graph`'s inputs read by `nodes` (default: all) or returned
    among `outputs` (default: all outputs)."""
    index = {v.id: k for k, v in enumerate(graph.inputs)}
    used = set()
    for node in graph.nodes if nodes is None else nodes:
        used.update(index[v.id] for v in node.inputs if type(v) is not Literal and v.id in index)
    for v in graph.outputs if outputs is None else outputs:
        if type(v) is not Literal and v.id in index:
            used.add(index[v.id])
    return used


def _slice(graph, carries):
    """The nodes of `graph` the outputs at `carries` depend on, in order."""
    wanted = {v.id for k in carries for v in [graph.outputs[k]] if type(v) is not Literal}
    kept = []
    for node in reversed(graph.nodes):
        if any(v.id in wanted for v in node.outputs):
            kept.append(node)
            wanted.update(v.id for v in node.inputs if type(v) is not Literal)
    return kept[::-1]


def _countable(node):
    prim = node.primitive
    return ((prim.elementwise or prim.name == "fused_elementwise")
            and not prim.runtime_value)


def _control_carries(cond_graph, body_graph, n_carry):
    """The carries the condition depends on, directly or through the body
    (a fixed point), or None when computing them needs anything but
    elementwise arithmetic."""
    if not all(_countable(n) for n in cond_graph.nodes):
        return None
    control = {k for k in _used_inputs(cond_graph) if k < n_carry}
    while True:
        nodes = _slice(body_graph, control)
        if not all(_countable(n) for n in nodes):
            return None
        grown = control | {k for k in _used_inputs(
            body_graph, nodes, [body_graph.outputs[k] for k in control]) if k < n_carry}
        if grown == control:
            return control
        control = grown


def _run(graph, nodes, values):
    """Run `nodes` of `graph` on {input index: value}; {Var id: value}."""
    env = {graph.inputs[k].id: v for k, v in values.items()}
    for node in nodes:
        args = [v.value if type(v) is Literal else env[v.id] for v in node.inputs]
        outs = node.primitive.kernel(*args, **node.params)
        if not node.primitive.multiple_results:
            outs = (outs,)
        for var, value in zip(node.outputs, outs):
            env[var.id] = np.asarray(value)
    return env


def _value(env, v):
    return np.asarray(v.value) if type(v) is Literal else env[v.id]


def _count(cond_graph, body_graph, n_carry, carry, cond_consts, body_consts, control):
    consts = {n_carry + k: np.asarray(c.value) for k, c in enumerate(cond_consts)
              if type(c) is Literal}
    body_in = {n_carry + k: np.asarray(c.value) for k, c in enumerate(body_consts)
               if type(c) is Literal}
    nodes = _slice(body_graph, control)
    outputs = {k: body_graph.outputs[k] for k in control}
    (predicate,) = cond_graph.outputs
    limit = cost_model.WHILE_LOOP_MAX_COUNTED_TRIPS
    with np.errstate(all="ignore"):
        for trips in range(limit + 1):
            env = _run(cond_graph, cond_graph.nodes, {**carry, **consts})
            if not bool(_value(env, predicate)):
                return trips
            env = _run(body_graph, nodes, {**carry, **body_in})
            carry = {k: _value(env, v) for k, v in outputs.items()}
    return None


def trips(node):
    """The trips the cost model counts for a while_loop `node`: its known
    count, else cost_model.WHILE_LOOP_ASSUMED_TRIPS."""
    known = known_trips(tuple(node.inputs), **node.params)
    return cost_model.WHILE_LOOP_ASSUMED_TRIPS if known is None else known


def uncounted(graph):
    """How many while loops in `graph` (sub-graphs included) the cost model
    counts at the assumed trips because their count is not in the program."""
    found = 0
    for node in graph.nodes:
        if node.primitive.name == "while_loop" and known_trips(
                tuple(node.inputs), **node.params) is None:
            found += 1
        for sub in subgraphs(node):
            found += uncounted(sub)
    return found
