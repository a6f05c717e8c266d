"""Lowering of control flow with compiled sub-graphs.

cond branches and while/scan bodies are compiled to Executables of their
own (with the same passes) when the outer program is lowered, and the loop
runs them directly: no per-iteration graph interpretation. The semantics
are those of the primitives' eager kernels in primitives/control_flow.py.
"""

import numpy as np

from keras_ipu.device.compiler.lowering import LOWERINGS


def _compile(graph, donated_inputs=()):
    # Imported here: the pipeline imports the executable, which lowers.
    from keras_ipu.device.compiler.executable import Executable
    from keras_ipu.device.compiler.options import CompileOptions
    from keras_ipu.device.compiler.pipeline import optimize

    # The outer compile already demoted sub-graphs with the outer program
    # (their signatures must match it); never demote them on their own.
    options = CompileOptions(demote_64bit=False, donated_inputs=donated_inputs)
    optimized, log = optimize(graph, options)
    return Executable(optimized, passes=log, donated_inputs=donated_inputs)


def _lower_cond(params, in_avals, out_avals):
    branches = [_compile(g) for g in params["branches"]]
    last = len(branches) - 1

    def cond(index, *operands):
        i = min(max(int(index), 0), last)
        return tuple(branches[i].run_unchecked(list(operands)))

    cond.subprograms = {f"branch {i}": b for i, b in enumerate(branches)}
    return cond


def _lower_while(params, in_avals, out_avals):
    cond_exe = _compile(params["cond_graph"])
    body_exe = _compile(params["body_graph"])
    n_carry = len(params["cond_graph"].inputs) - params["n_cond_consts"]
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
    # The body may update its carries in place (donation.py): the loop owns
    # them. An initial carry the outer program does not own (`owned_carry`,
    # from the Executable) is copied once before the loop when the body
    # writes into it; a result the body did not allocate (a pass-through, a
    # view) is copied before it becomes a carry the body writes into.
    body = _compile(params["body"], donated_inputs=tuple(range(n_carry)))
    owned = params.get("owned_carry", ())
    written = [k for k in range(n_carry) if k in body.written_inputs]
    copy_first = tuple(k for k in written if k not in owned)
    recopy = tuple(k for k in written if not body.owned_outputs[k])
    y_avals = out_avals[n_carry:]

    def scan(*operands):
        carry = list(operands[:n_carry])
        for k in copy_first:
            carry[k] = np.array(carry[k])
        xs = operands[n_carry:n_carry + n_xs]
        consts = list(operands[n_carry + n_xs:])
        ys = [np.empty(a.shape, a.dtype) for a in y_avals]
        steps = range(length - 1, -1, -1) if reverse else range(length)
        for t in steps:
            outs = body.run_unchecked(carry + [x[t] for x in xs] + consts)
            carry = outs[:n_carry]
            for k in recopy:
                carry[k] = np.array(carry[k])
            for y, value in zip(ys, outs[n_carry:]):
                y[t] = value
        return tuple(carry) + tuple(ys)

    scan.subprograms = {"body": body}
    return scan


LOWERINGS["cond"] = _lower_cond
LOWERINGS["while_loop"] = _lower_while
LOWERINGS["scan"] = _lower_scan
