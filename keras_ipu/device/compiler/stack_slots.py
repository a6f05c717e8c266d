"""A scan body writing its stacked outputs straight into their slots.

A scan stacks each time step's outputs (`ys`) into arrays of (length, ...):
the loop copied every result into ys[t] after the body made it in an array
of its own (the LSTM's forward body: 7 results of 64 KiB per time step,
14 MiB per scan; issue 16, tenth pass: about 2.5 ms of a 60 ms step).
Here the kernel that makes such a result writes it into ys[t] itself:

- a fused chain's C kernel (native_fusion.native_kernel's `placed`), whose
  buffers are any contiguous arrays of the right size;
- a concatenate (NumPy's, with `out=`);
- a concatenate's operands along its columns, where all are results of one
  C chain that nothing else reads (the LSTM's backward gate gradients: 4
  of 128 columns each): the chain writes them into the column blocks of
  the concatenate's slot (the C kernel's outputs with rows apart) and the
  concatenate goes (issue 16, thirteenth pass: 1.1 ms per step).

All store the same bits wherever they store them. The body's run function
(straight_line.py) takes the slots after its inputs; a result the kernel
did not write into its slot (the C kernel refused an operand and NumPy's
kernel ran) is copied as before. Only results the body returns once and
not as a carry are placed: a carry's buffer goes on to the next step, which
may write into it. Not done with a floating-point behaviour set (its
checks wrap each kernel).
"""

from collections import Counter
from typing import NamedTuple

import numpy as np

from keras_ipu.device.ir import Var


class StackedBody(NamedTuple):
    """A scan body's run function and what it writes into the slots."""

    run: object        # run(arrays + slots + next slots) -> outputs
    placed: tuple      # per stacked output: whether `run` takes its slot
    forwarded: tuple   # per stacked output: the carry (its index) it stacks
                       # when `run` writes that carry into the next time
                       # step's slot (a next slot), else None
    run_last: object   # run(arrays + slots): the last time step's (no next)


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


def _chain_into_columns(placing, n_operands, positions, edges):
    """A C chain's kernel f(*xs, dest) writing its results at `positions`
    into the column blocks `edges` of the 2-d `dest` (placing: its kernel
    taking slots for them); NumPy's kernel's new arrays (an operand the C
    kernel refused) are concatenated into dest."""
    columns = tuple(slice(lo, hi) for lo, hi in zip(edges[:-1], edges[1:]))

    def chain_into_columns(*args):
        xs, dest = args[:n_operands], args[n_operands]
        views = [dest[:, c] for c in columns]
        results = placing(*xs, *views)
        if any(results[p] is not v for p, v in zip(positions, views)):
            np.concatenate([results[p] for p in positions], axis=1, out=dest)
        return results

    return chain_into_columns


def _given(*args):
    """A concatenate whose operands its chain wrote into its slot: the slot."""
    return args[-1]


def _columns(body, targets, n_ys):
    """{chain node index: (concatenate node index, result positions, column
    edges)}: concatenates placed in a slot (2-d, along the columns) whose
    operands are each a result of one C chain that only they read."""
    nodes = body.graph.nodes
    producer = {v: (i, k) for i, node in enumerate(nodes) for k, v in enumerate(node.outputs)}
    reads = Counter(v for node in nodes for v in node.inputs if type(v) is Var)
    reads.update(v for v in body.graph.outputs if type(v) is Var)
    found = {}
    for i, slots in targets.items():
        node = nodes[i]
        out = node.outputs[0].aval
        if (node.primitive.name != "concatenate" or out.ndim != 2
                or node.params["axis"] % 2 != 1 or tuple(slots) != (0,) or slots[0] >= n_ys):
            continue
        made = [producer.get(v) if type(v) is Var else None for v in node.inputs]
        if any(m is None for m in made) or len({c for c, _ in made}) != 1:
            continue
        chain, positions = made[0][0], tuple(k for _, k in made)
        if (chain in targets or nodes[chain].primitive.name != "fused_elementwise"
                or len(set(positions)) < len(positions)
                or any(reads[v] != 1 or v.aval.dtype != out.dtype for v in node.inputs)):
            continue
        edges = np.cumsum([0] + [v.aval.shape[1] for v in node.inputs])
        found[chain] = (i, positions, tuple(int(e) for e in edges))
    return found


def _placeable(node, kernel, positions):
    """The positions among `positions` whose results `kernel` can write
    into a slot: a C chain's results with buffers of their own."""
    if node.primitive.name == "fused_elementwise":
        return tuple(p for p in positions if p in getattr(kernel, "placeable", ()))
    return positions


def _run_with(body, targets, n_ys):
    """(run function, placed slot indices) of `body` with the results at
    `targets` ({node index: {result position: slot index}}; slot j < n_ys:
    stacked output j's slot; n_ys + j: its next one) written into their
    slots where the kernels can."""
    columns = _columns(body, targets, n_ys)
    own_kernel = {body._program[i][0]: i for i in (*targets, *columns)}
    first_slot = len(body._template)
    steps, placed = [], set()
    given = set()  # concatenates whose chain writes into their slot
    for kernel, ins, out, multi, frees in body._run_program:
        i = own_kernel.get(kernel)
        if i in columns:
            concatenate, positions, edges = columns[i]
            # Also a result that would go into a donated operand (the LSTM's
            # backward chain donates two of its gradients' operands).
            placing = (kernel.placed(positions, over_donated=True) if set(positions)
                       <= getattr(kernel, "placeable_over_donated", frozenset()) else None)
            if placing is not None:
                slot = first_slot + targets[concatenate][0]
                steps.append((_chain_into_columns(placing, len(ins), positions, edges),
                              ins + (slot,), out, multi, frees))
                given.add(concatenate)
                continue
            i = None
        if i in given:
            steps.append((_given, ins + (first_slot + targets[i][0],), out, multi, frees))
            placed.add(targets[i][0])
            continue
        if i is not None:
            node = body.graph.nodes[i]
            positions = _placeable(node, kernel, tuple(sorted(targets[i])))
            placing = _placing_kernel(node, kernel, positions) if positions else None
            if placing is not None:
                slots = tuple(first_slot + targets[i][p] for p in positions)
                placed.update(targets[i][p] for p in positions)
                steps.append((placing, ins + slots, out, multi, frees))
                continue
        steps.append((kernel, ins, out, multi, frees))
    extra = tuple(first_slot + j for j in range(2 * n_ys) if j in placed)
    return body.straight_line(tuple(steps), extra_inputs=extra), placed


def stacked_body(body, n_carry):
    """StackedBody of a compiled scan body (an Executable) whose kernels can
    write some of its stacked outputs into their slots, or None.

    A stacked output that is a carry coming in (the LSTM's h and c, stacked
    for the backward pass) is the carry the step before made: that step's
    kernel writes it into this step's slot, and the carry goes on as a view
    of it; not where the body writes into that carry (donation.py)."""
    if getattr(body, "_run_program", None) is None or body._run_straight is None:
        return None
    behaviour = body.fp_behaviour
    if behaviour is not None and behaviour.active:
        return None  # each kernel wrapped by numerics.py: left as compiled
    inputs, outputs = body.graph.inputs, body.graph.outputs
    ys = outputs[n_carry:]
    producer = {v: i for i, node in enumerate(body.graph.nodes) for v in node.outputs}

    def target(v):
        """(node index, result position) making the output v alone, or None."""
        if type(v) is not Var or v not in producer or outputs.count(v) > 1:
            return None
        i = producer[v]
        return i, body.graph.nodes[i].outputs.index(v)

    now, later, forwards = {}, {}, {}
    for j, v in enumerate(ys):
        if v.aval.ndim == 0:
            continue  # ys[t] of a 1-d array is a NumPy scalar, not a view to write into
        made = target(v)
        if made is not None:
            now.setdefault(made[0], {})[made[1]] = j
        elif v in inputs[:n_carry] and inputs.index(v) not in body.written_inputs:
            carry = inputs.index(v)
            made = target(outputs[carry])
            if made is not None:
                forwards[j] = carry
                later.setdefault(made[0], {})[made[1]] = len(ys) + j
    if not now and not later:
        return None
    both = {i: {**now.get(i, {}), **later.get(i, {})} for i in {*now, *later}}
    run, placed = _run_with(body, both, len(ys))
    run_last, placed_last = _run_with(body, now, len(ys))
    if run is None or run_last is None or not placed:
        return None
    return StackedBody(run, tuple(j in placed_last for j in range(len(ys))),
                       tuple(forwards[j] if len(ys) + j in placed else None
                             for j in range(len(ys))), run_last)


def runner(body, n_carry):
    """StackedBody of a scan body: its stacked outputs written into their
    slots where its kernels can, else its plain run (none placed)."""
    stacked = stacked_body(body, n_carry)
    if stacked is not None:
        return stacked

    # run_unchecked looked up at each call, as the loop did before stacking:
    # a wrapper of Executable.run_unchecked installed after this scan was
    # lowered (a cached program) still sees its body run (the fault tests'
    # Ctrl-C inside a program, the profile's recording of the device loop's
    # body: benchmarks/tf_bridge_resnet50.py).
    def run(arrays):
        return body.run_unchecked(arrays)

    return StackedBody(run, (), (), run)
