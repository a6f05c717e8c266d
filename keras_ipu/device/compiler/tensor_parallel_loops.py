"""The tensor-parallel rules of control flow (see tensor_parallel_rules.py
for what a rule returns): scan (the device loop, accumulation loops),
while_loop and cond partition their sub-graphs with the shardings of
their operands, the carries settled to the shardings the body keeps."""

from keras_ipu.device.compiler.tensor_parallel_shardings import is_split
from keras_ipu.device.compiler.tensor_parallel_shardings import whole
from keras_ipu.device.simulator import loop_trips


def _settled_carries(p, body, carry, rest):
    """The carries' shardings a loop body keeps (a carry split inside the
    body, a weight's update or a slot's, is split from the start), found by
    trial partitions of the body until they stop changing; `rest`: the
    shardings of the body's other inputs, after the carries. A carry only
    ever goes from whole to split, and each trial that changes something
    splits at least one more, so len(carry) + 1 trials settle them all
    (a chain of carries, each updated from the one before, needs them)."""
    outs = None
    for _ in range(len(carry) + 1):
        _, outs = p.trial().graph(body, carry + rest)
        settled = [c if c is not None else (o if is_split(o) else None)
                   for c, o in zip(carry, outs[:len(carry)])]
        if settled == carry:
            break
        carry = settled
    return carry, whole(outs[len(carry):])


def scan(p, node, have):
    params = node.params
    body = params["body"]
    n_carry, n_xs = params["n_carry"], params["n_xs"]
    carry = whole(have[:n_carry])
    # Each trip reads slice t of the xs' leading dimension: a split of
    # another dimension is the body's one before it; a split of the leading
    # one is gathered first.
    xs = [s - 1 if is_split(s) and s > 0 else None for s in have[n_carry:n_carry + n_xs]]
    consts = whole(have[n_carry + n_xs:])
    carry, ys = _settled_carries(p, body, carry, xs + consts)
    local_body, _ = p.repeated(params.get("length"), lambda: p.graph(
        body, carry + xs + consts, out_wanted=carry + ys))
    wanted = carry + [x + 1 if x is not None else None for x in xs] + consts
    results = carry + [y + 1 if y is not None else None for y in ys]
    return wanted, results, {**params, "body": local_body}


def while_loop(p, node, have):
    """As a scan's carries; the condition reads them as the body leaves
    them. Its trips: those its cost rule counts (simulator/loop_trips.py)."""
    params = node.params
    cond_graph, body = params["cond_graph"], params["body_graph"]
    n_carry = len(cond_graph.inputs) - params["n_cond_consts"]
    carry = whole(have[:n_carry])
    cond_consts = whole(have[n_carry:n_carry + params["n_cond_consts"]])
    body_consts = whole(have[n_carry + params["n_cond_consts"]:])
    carry, _ = _settled_carries(p, body, carry, body_consts)
    local_cond, local_body = p.repeated(loop_trips.trips(node), lambda: (
        p.graph(cond_graph, carry + cond_consts, out_wanted=[None])[0],
        p.graph(body, carry + body_consts, out_wanted=carry)[0]))
    return (carry + cond_consts + body_consts, list(carry),
            {**params, "cond_graph": local_cond, "body_graph": local_body})


def cond(p, node, have):
    """Every branch takes the operands as they are and leaves its results
    as the first branch does. One branch runs per run: the collectives
    listed are those of the branch that moves the most bytes (the first on
    a tie), what a run sends at most; the prediction reads the local
    program and counts the costliest branch, as the cond's cost rule."""
    branches = node.params["branches"]
    operands = whole(have[1:])
    _, outs = p.trial().graph(branches[0], operands)
    outs = whole(outs)
    before = len(p.collectives)
    local, found = [], []
    for b in branches:
        local.append(p.graph(b, operands, out_wanted=outs)[0])
        found.append(p.collectives[before:])
        del p.collectives[before:]
    p.collectives += max(found, key=lambda cs: sum(c.count * c.nbytes for c in cs))
    return [None] + operands, outs, {**node.params, "branches": tuple(local)}
