"""Lowering of control flow with compiled sub-graphs.

cond branches and while/scan bodies are compiled to Executables of their
own before the outer program is lowered (`compile_bodies`, called by the
pipeline with the outer program's options), and the loop runs them
directly: no per-iteration graph interpretation. The semantics are those
of the primitives' eager kernels in primitives/control_flow.py.
"""

import numpy as np

from keras_ipu.device.native.threads import blocks_backing_off
from keras_ipu.device.native.threads import max_threads

from keras_ipu.device.compiler import scan_rows
from keras_ipu.device.compiler import stack_slots
from keras_ipu.device.compiler.graph_utils import copy_node
from keras_ipu.device.compiler.graph_utils import rebuilt
from keras_ipu.device.compiler.lowering import LOWERINGS
from keras_ipu.device.primitives.control_flow import cond_p
from keras_ipu.device.primitives.control_flow import scan_p
from keras_ipu.device.primitives.control_flow import while_p


def _cond_bodies(params, compile_body):
    return tuple(compile_body(g) for g in params["branches"])


def _while_bodies(params, compile_body):
    return compile_body(params["cond_graph"]), compile_body(params["body_graph"])


def _scan_body(params, compile_body):
    # The body may update its carries in place (donation.py): the loop owns
    # them. A body whose rows never meet is also compiled for blocks of its
    # rows, which threads run at once (scan_rows.py).
    donated = tuple(range(params["n_carry"]))
    whole = compile_body(params["body"], donated)
    if not hasattr(whole, "run_unchecked"):  # running_graph's: graphs only
        return whole
    return scan_rows.compile_blocks(params["body"], params["n_carry"], params["n_xs"],
                                    whole, compile_body, donated)


# primitive -> how its sub-graphs are compiled:
# fn(params, compile_body) -> what its lowering finds in params["compiled"];
# compile_body(graph, donated_inputs=()) -> Executable.
_BODIES = {cond_p: _cond_bodies, while_p: _while_bodies, scan_p: _scan_body}


def compile_bodies(graph, compile_body):
    """{node index: compiled sub-graphs} for the control-flow nodes of
    `graph` that run compiled bodies."""
    return {
        i: _BODIES[node.primitive](node.params, compile_body)
        for i, node in enumerate(graph.nodes)
        if node.primitive in _BODIES
    }


# primitive -> its params naming the sub-graphs, from what _BODIES made of
# them (a Graph for each compiled body): with_bodies' inverse of _BODIES.
_PARAMS = {
    cond_p: lambda branches: {"branches": tuple(branches)},
    while_p: lambda bodies: {"cond_graph": bodies[0], "body_graph": bodies[1]},
    scan_p: lambda body: {"body": body},
}


def with_bodies(graph, compiled, graph_of=lambda body: body):
    """`graph` whose control-flow nodes hold, in place of the sub-graphs
    they were traced with, the bodies that run: `compiled` ({node index:
    what compile_bodies made}), each made a Graph by `graph_of` (an
    Executable's running_graph; identity when compile_bodies made Graphs).
    Loop bodies are optimized apart (elementwise chains fused) when
    compiled, so the cost and memory models read these, not the traced
    ones. The other nodes, the inputs and the outputs are graph's own."""
    if not compiled:
        return graph

    def graphs(made):
        if isinstance(made, scan_rows.RowBlocks):
            made = made.whole
        return tuple(map(graph_of, made)) if isinstance(made, tuple) else graph_of(made)

    nodes = list(graph.nodes)
    for i, made in compiled.items():
        node = nodes[i]
        nodes[i] = copy_node(node, node.inputs,
                             params={**node.params, **_PARAMS[node.primitive](graphs(made))})
    return rebuilt(graph, nodes, {})


def _compiled(params, name):
    compiled = params.get("compiled")
    if compiled is None:
        raise ValueError(
            f"`{name}` runs compiled sub-graphs: compile the program with "
            "keras_ipu.device.compiler.compile_graph, which compiles them first."
        )
    return compiled


def _lower_cond(params, in_avals, out_avals):
    branches = _compiled(params, "cond")
    last = len(branches) - 1

    def cond(index, *operands):
        i = min(max(int(index), 0), last)
        return tuple(branches[i].run_unchecked(list(operands)))

    cond.subprograms = {f"branch {i}": b for i, b in enumerate(branches)}
    return cond


def _lower_while(params, in_avals, out_avals):
    cond_exe, body_exe = _compiled(params, "while_loop")
    n_carry = while_p.carry_count(params)
    n_cond = params["n_cond_consts"]

    def while_loop(*operands):
        carry = list(operands[:n_carry])
        cond_consts = list(operands[n_carry:n_carry + n_cond])
        body_consts = list(operands[n_carry + n_cond:])
        while bool(cond_exe.run_unchecked(carry + cond_consts)[0]):
            carry = body_exe.run_unchecked(carry + body_consts)
        return tuple(carry)

    while_loop.subprograms = {"cond": cond_exe, "body": body_exe}
    return while_loop


def _lower_scan(params, in_avals, out_avals):
    n_carry, n_xs = params["n_carry"], params["n_xs"]
    length, reverse = params["length"], params["reverse"]
    body = _compiled(params, "scan")
    steps = range(length - 1, -1, -1) if reverse else range(length)
    split = None
    if isinstance(body, scan_rows.RowBlocks):
        blocks, body = body.blocks, body.whole
        if max_threads() >= 2:  # (an executable compiled for more, unpickled)
            split = scan_rows.block_runner(blocks, n_carry, steps,
                                           out_avals[:n_carry], out_avals[n_carry:])
    # An initial carry the outer program does not own (`owned_carry`, from
    # the Executable) is copied once before the loop when the body writes
    # into it; a result the body did not allocate (a pass-through, a view)
    # is copied before it becomes a carry the body writes into.
    owned = params.get("owned_carry", ())
    copy_first = tuple(k for k in range(n_carry) if k in body.written_inputs and k not in owned)
    recopy = scan_rows.recopied(body, n_carry)
    y_avals = out_avals[n_carry:]
    stacked = stack_slots.runner(body, n_carry)

    def scan(*operands):
        if split is not None and not blocks_backing_off():
            return split(operands[:n_carry], operands[n_carry:n_carry + n_xs],
                         list(operands[n_carry + n_xs:]))
        carry = list(operands[:n_carry])
        for k in copy_first:
            carry[k] = np.array(carry[k])
        ys = [np.empty(a.shape, a.dtype) for a in y_avals]
        carry = scan_rows.run_steps(stacked, steps, carry, operands[n_carry:n_carry + n_xs],
                                    list(operands[n_carry + n_xs:]), recopy, ys)
        return tuple(carry) + tuple(ys)

    scan.subprograms = {"body": body}
    return scan


LOWERINGS["cond"] = _lower_cond
LOWERINGS["while_loop"] = _lower_while
LOWERINGS["scan"] = _lower_scan
