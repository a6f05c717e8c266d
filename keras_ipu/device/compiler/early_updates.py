"""In-place updates run as soon as their operands are ready.

A training step computes every gradient first and then the optimizer's
updates, in Keras' order: the update of a weight runs long after its
gradient was made. In between, the rest of the backward pass streams
the other layers' weights and gradients through the caches, so each
update reads its gradient back from memory, and the gradient's buffer
stays allocated meanwhile. Keras' demo_functional model (batch 32, Adam,
one thread) runs each 512x512 Adam update in 0.19-0.26 ms in the step
against 0.105 ms warm (issue 16, tenth pass).

So the run loop runs an *update* (a fused chain writing all its results
into operands it donates: nothing new allocated; an optimizer's update of
m, v and w) right after the last step it waits for: the product making
its gradient, the last reader of the weight it overwrites. What it waits
for that is small and not yet run (the learning rate's scalar chain,
read by every update) is pulled up with it. Every kernel computes what it
computes in program order, on the same operands: the same bits. Steps
other than elementwise and plain array kernels (control flow, effects)
keep their place, and nothing moves across them. Each freed slot is
cleared after its last reader in the new order.

Only the run loop sees the new order (Executable._run_program); the
graph, its costs and profiles, and the kernel list (`_program`) keep the
program's. With several threads the run loop launches weight gradients
beside the input gradients (concurrent_steps.py): an update right after
its gradient would wait for it, so there an update moves only where it
can run in the same launched job as the product making its gradient
(concurrent_steps.pairs_with), one after the other on a pool thread
while the run loop goes on.
"""

from keras_ipu.device.compiler import concurrent_steps
from keras_ipu.device.compiler.update_steps import donated_slots
from keras_ipu.device.compiler.update_steps import is_update
from keras_ipu.device.compiler.update_steps import result_bytes

# What a pulled-up step may make: scalars and short vectors (a learning
# rate's bias correction). Larger results would live longer for nothing.
MAX_PULLED_BYTES = 1024


def _dependencies(program, nodes):
    """Per step, the steps that must run before it if it moves up: the
    producers of its operands, the other readers of an operand it
    overwrites (donates), and the last step before it that is not plain."""
    producer, readers = {}, {}
    for i, (_, ins, out, multi, _) in enumerate(program):
        for s in ins:
            readers.setdefault(s, []).append(i)
        for s in out if multi else (out,):
            producer[s] = i
    deps, last_barrier = [], None
    for i, (step, node) in enumerate(zip(program, nodes)):
        before = {producer[s] for s in step[1] if s in producer and producer[s] < i}
        for s in donated_slots(step, node):
            before.update(r for r in readers[s] if r < i)
        if last_barrier is not None:
            before.add(last_barrier)
        deps.append(before)
        if not concurrent_steps.is_plain(node):
            last_barrier = i
    return deps


def early_order(program, nodes, can_move=None):
    """The steps' indices in the order the run loop runs them (module doc).
    `can_move(j, after)`: whether update j may move up to right after step
    `after` (the last step it waits for that is not pulled up with it);
    None: every update may."""
    n = len(program)
    updates = [is_update(node) for node in nodes]
    if not any(updates):
        return list(range(n))
    deps = _dependencies(program, nodes)
    pullable = [
        concurrent_steps.is_plain(node) and not node.params.get("donate") and (result_bytes(node) or 0) > 0
        and result_bytes(node) <= MAX_PULLED_BYTES
        for node in nodes
    ]
    order, placed = [], [False] * n

    def missing(i, seen, ignored=None):
        """The unplaced steps i waits for but `ignored`, in an order they
        can run in (themselves pullable, recursively), or None if one is
        not."""
        need = []
        for d in sorted(deps[i]):
            if placed[d] or d in seen or d == ignored:
                continue
            if not pullable[d]:
                return None
            seen.add(d)
            below = missing(d, seen)
            if below is None:
                return None
            need += below + [d]
        return need

    def place(i):
        order.append(i)
        placed[i] = True

    # An update runs right after the last step it waits for that is not
    # pulled up with it; what it pulls runs before that step, so the update
    # follows it directly (concurrent_steps.py pairs them).
    moving_after = {}
    for j in range(n):
        if updates[j]:
            after = max((d for d in deps[j] if not pullable[d]), default=-1)
            if after >= 0 and (can_move is None or can_move(j, after)):
                moving_after.setdefault(after, []).append(j)
    # The small steps the moving updates pull run as soon as they can:
    # between a product and its update they would keep the product
    # from running beside the steps before it (concurrent_steps.py).
    pulled, stack = set(), [j for steps in moving_after.values() for j in steps]
    while stack:
        for d in deps[stack.pop()]:
            if pullable[d] and d not in pulled:
                pulled.add(d)
                stack.append(d)
    for i in range(n):
        for d in sorted(pulled):
            if not placed[d] and all(placed[e] for e in deps[d]):
                place(d)
        if placed[i]:
            continue
        following = []
        for j in moving_after.get(i, ()):
            need = missing(j, set(), ignored=i)
            if need is not None and not placed[j]:
                for d in need:
                    place(d)
                following.append(j)
        if updates[i]:  # at its own place: all it waits for ran before
            for d in missing(i, set()) or ():
                place(d)
        place(i)
        for j in following:
            place(j)
    return order


def early_program(program, nodes, can_move=None):
    """(steps, nodes) of `program` (one step per node) in early_order, each
    freed slot cleared after its last reader in that order; `program`
    itself when nothing moves."""
    order = early_order(program, nodes, can_move)
    if order == list(range(len(program))):
        return program, nodes
    position = {i: p for p, i in enumerate(order)}
    last = {}
    for i, (_, ins, out, multi, frees) in enumerate(program):
        for s in frees:
            # Freed after its producer (nobody reads it) or its last reader.
            last.setdefault(s, []).append(position[i])
    for i, (_, ins, out, multi, _) in enumerate(program):
        for s in (*ins, *(out if multi else (out,))):
            if s in last:
                last[s].append(position[i])
    frees_at = [[] for _ in order]
    for s, positions in last.items():
        frees_at[max(positions)].append(s)
    steps = tuple(
        (*program[i][:4], tuple(sorted(frees_at[p]))) for p, i in enumerate(order)
    )
    return steps, [nodes[i] for i in order]
