"""A scan body writing its stacked outputs straight into their slots.

A scan stacks each time step's outputs (`ys`) into arrays of (length, ...):
the loop copied every result into ys[t] after the body made it in an array
of its own (the LSTM's forward body: 7 results of 64 KiB per time step,
14 MiB per scan; issue 16, tenth pass: about 2.5 ms of a 60 ms step).
Here the kernel that makes such a result writes it into ys[t] itself:

- a fused chain's C kernel (native_fusion.native_kernel's `placed`), whose
  buffers are any contiguous arrays of the right size;
- a concatenate (NumPy's, with `out=`).

Both store the same bits wherever they store them. The body's run function
(straight_line.py) takes the slots after its inputs; a result the kernel
did not write into its slot (the C kernel refused an operand and NumPy's
kernel ran) is copied as before. Only results the body returns once and
not as a carry are placed: a carry's buffer goes on to the next step, which
may write into it.
"""

from typing import NamedTuple

import numpy as np

from keras_ipu.device.ir import Var


class StackedBody(NamedTuple):
    """A scan body's run function and what it writes into the slots."""

    run: object      # run(arrays + slots) -> outputs; slots: ys[t] where placed
    placed: tuple    # per stacked output: whether `run` takes its slot


def _concatenate_into(n_operands, axis):
    def concatenate_into(*args):
        return np.concatenate(args[:n_operands], axis=axis, out=args[n_operands])

    return concatenate_into


def _placing_kernel(node, kernel, positions):
    """`kernel` (node's own) taking its results at `positions` in slots
    after its operands, or None."""
    name = node.primitive.name
    if name == "fused_elementwise":
        placed = getattr(kernel, "placed", None)  # C chains only
        return placed(positions) if placed is not None else None
    if name == "concatenate" and all(
            v.aval.dtype == node.outputs[0].aval.dtype for v in node.inputs):
        return _concatenate_into(len(node.inputs), node.params["axis"])
    return None


def _placeable(node, kernel, positions):
    """The positions among `positions` whose results `kernel` can write
    into a slot: a C chain's results with buffers of their own."""
    if node.primitive.name == "fused_elementwise":
        return tuple(p for p in positions if p in getattr(kernel, "placeable", ()))
    return positions


def stacked_body(body, n_carry):
    """StackedBody of a compiled scan body (an Executable) whose kernels can
    write some of its stacked outputs into their slots, or None."""
    run_program = getattr(body, "_run_program", None)
    if run_program is None or body._run_straight is None:
        return None
    outputs = body.graph.outputs
    ys = outputs[n_carry:]
    producer = {v: i for i, node in enumerate(body.graph.nodes) for v in node.outputs}
    wanted = {}  # node index -> {result position: stacked output index}
    for j, v in enumerate(ys):
        if type(v) is not Var or v not in producer or outputs.count(v) > 1:
            continue
        i = producer[v]
        wanted.setdefault(i, {})[body.graph.nodes[i].outputs.index(v)] = j
    if not wanted:
        return None
    own_kernel = {body._program[i][0]: i for i in wanted}
    first_slot = len(body._template)
    steps, placed = [], [False] * len(ys)
    for kernel, ins, out, multi, frees in run_program:
        i = own_kernel.get(kernel)
        if i is not None:
            node = body.graph.nodes[i]
            positions = _placeable(node, kernel, tuple(sorted(wanted[i])))
            placing = _placing_kernel(node, kernel, positions) if positions else None
            if placing is not None:
                slots = tuple(first_slot + wanted[i][p] for p in positions)
                for p in positions:
                    placed[wanted[i][p]] = True
                steps.append((placing, ins + slots, out, multi, frees))
                continue
        steps.append((kernel, ins, out, multi, frees))
    if not any(placed):
        return None
    extra = tuple(first_slot + j for j, p in enumerate(placed) if p)
    run = body.straight_line(tuple(steps), extra_inputs=extra)
    return None if run is None else StackedBody(run, tuple(placed))


def runner(body, n_carry):
    """StackedBody of a scan body: its stacked outputs written into their
    slots where its kernels can, else its plain run (none placed)."""
    return stacked_body(body, n_carry) or StackedBody(body.run_unchecked, ())
