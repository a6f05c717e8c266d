"""Independent products of a program run at the same time on the host.

A Dense layer's backward pass has two products that read the same
gradient and nothing of each other: the input gradient (g @ W^T) and the
weight gradient (x^T @ g), and the program's order puts them next to each
other. A product splits over threads from 64 MFLOP (two threads of
device/native/threads.py's FLOPS_PER_THREAD); below that a pair of them
together may still be worth two threads by the same policy (a batch-64
Dense 512 layer: 34 MFLOP each): they run at once, one on the caller's
thread and one on a pool thread. Blocks are claimed one at a time
(threads.parallel_for), so when no pool thread gets a core in time the
caller runs both, as before. Keras' demo_functional at batch 32 (17 MFLOP
products, 34 a pair) stays one product at a time: on 16 idle cores such
products gained nothing from any thread count (issue 16, third pass).

Decided per pair when the program is bound, by size: two adjacent
dot_general steps, the second not reading the first's result, each on
one thread by the policy (threads_for of its FLOPs is 1), together worth
two (threads_for of their sum is at least 2). Products allocate their
results and never write into their operands (donation.py), so running
two at once cannot race. Each product is computed by its own kernel
exactly as alone: the values are the same bits. Not done with a
floating-point behaviour set (numerics.py wraps each kernel and counts
on the program's order), nor with a cap of one thread.

Only the run loop sees the pairs (Executable._run_program); the graph,
its costs and profiles, and the kernel list (`_program`) keep one step
per node.
"""

import numpy as np

from keras_ipu.device.native import threads as host_threads
from keras_ipu.device.primitives.dot import split_dimensions


def product_flops(node):
    """Floating-point operations of a dot_general node (2 per
    multiply-add), or None when a shape is not static."""
    lhs, rhs = (v.aval for v in node.inputs)
    out = node.outputs[0].aval
    if not (lhs.is_static() and out.is_static()):
        return None
    lc = split_dimensions(lhs.ndim, rhs.ndim, node.params["dimension_numbers"])[0]
    k = int(np.prod([lhs.shape[d] for d in lc], dtype=np.int64))
    return 2 * int(np.prod(out.shape, dtype=np.int64)) * k


def _pairable(first, second):
    if first.primitive.name != "dot_general" or second.primitive.name != "dot_general":
        return False
    if any(v in first.outputs for v in second.inputs):
        return False
    flops = (product_flops(first), product_flops(second))
    if None in flops:
        return False
    threads_for = host_threads.threads_for
    return (threads_for(flops[0]) == 1 and threads_for(flops[1]) == 1
            and threads_for(sum(flops)) >= 2)


def _pair(a, b):
    """One run-loop step computing steps `a` and `b` at once."""
    kernel_a, ins_a, out_a, _, frees_a = a
    kernel_b, ins_b, out_b, _, frees_b = b
    n_a = len(ins_a)

    def concurrent_products(*xs):
        results = [None, None]

        def part(i):
            if i == 0:
                results[0] = kernel_a(*xs[:n_a])
            else:
                results[1] = kernel_b(*xs[n_a:])

        host_threads.parallel_for(part, 2, 2)
        return results

    return (concurrent_products, ins_a + ins_b, (out_a, out_b), True, frees_a + frees_b)


def paired_steps(program, nodes):
    """The run loop's steps: `program` (one step per node) with pairs of
    independent products merged into one concurrent step (module doc)."""
    if host_threads.max_threads() < 2:
        return program
    steps, i = [], 0
    while i < len(program):
        if (i + 1 < len(program) and not program[i][3] and not program[i + 1][3]
                and _pairable(nodes[i], nodes[i + 1])):
            steps.append(_pair(program[i], program[i + 1]))
            i += 2
        else:
            steps.append(program[i])
            i += 1
    return tuple(steps)
