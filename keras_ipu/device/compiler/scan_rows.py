"""A scan whose rows never meet, run in blocks of rows on several threads.

A recurrent layer's scan (Keras' LSTM, GRU, SimpleRNN) carries (batch,
units) arrays whose rows never meet: each step of its body is elementwise,
a slice, pad or concatenate along other axes, or a product of the rows by a
weight (once scan_splitting.py has moved the products summing over the
batch out of the loop). Its kernels are small (an LSTM 128 cell at batch
128: 0.1-0.3 ms each, 7 per time step), too small to hand to a second
thread one by one (issue 16, tenth pass: the gate chain's split never
shared its ranges), so at two threads the recurrence ran on one. Here each
thread runs the whole loop, every time step, for a block of the rows: one
hand-off per scan instead of one per kernel.

Each block runs a body compiled for its rows (the traced body traced again
at the block's shape), whose kernels stay on one thread (the threads are
the blocks). The values are the loop's bits: elementwise kernels compute
each element alone, and the products split in row blocks this host's BLAS
sums as it sums the whole product (product_pool.rule: rows at multiples of
12 on OpenBLAS' Haswell kernels, each block above its small-matrix bound).
A body with a product no rule covers (no C product pool, another dtype)
does not split, nor does one without a product (too little work per row).

Not done with a floating-point behaviour set (as concurrent_steps.py). At
run time the blocks run at once only with two threads or more and while
such splits are not backing off (threads.blocks_backing_off: a busy
machine); else the whole body runs, as before. A split whose threads did
not run at once (its wall time near their CPU time together:
threads.note_blocks) starts that back-off, and on two threads the shared
one; the shared one alone (a late join or product split: one kernel's
hand-off) does not stop the blocks.
"""

import math
import time
from typing import NamedTuple

import numpy as np

from keras_ipu.device.interpreter import eval_graph
from keras_ipu.device.ir import Literal
from keras_ipu.device.ir import ShapedArray
from keras_ipu.device.native import product_pool
from keras_ipu.device.native import threads as host_threads
from keras_ipu.device.compiler import stack_slots
from keras_ipu.device.compiler.dot_lowering import product_shape
from keras_ipu.device.trace import trace_flat


class RowBlocks(NamedTuple):
    """A scan body compiled whole and for each block of its rows."""

    whole: object   # the body's Executable for all rows
    blocks: tuple   # ((lo, hi, Executable for rows lo:hi), ...)


def _row_product(node, rows, batched):
    """(compute dtype, multiply-adds per row) of a product of batched rows
    by an unbatched operand keeping the rows first in its result, or None."""
    lhs, rhs = node.inputs
    if lhs not in batched or rhs in batched or type(rhs) is Literal:
        return None
    (lc, _), (lb, _) = node.params["dimension_numbers"]
    if lb or 0 in lc:
        return None
    b, m, n, k, compute = product_shape(node.params, lhs.aval, rhs.aval)
    return np.dtype(compute), m // rows * n * k


def _rows_pass(node, rows, batched):
    """Whether `node` maps each row of its batched operands to that row of
    its result (its result then batched), or None: it mixes rows, or is not
    a kind this knows. Unbatched operands must not span the rows."""
    name = node.primitive.name
    ins = node.inputs
    out = node.outputs[0].aval
    if node.primitive.multiple_results or name == "fused_elementwise":
        return None
    if not any(v in batched for v in ins):
        # Computed from the constants alone: the same in every block.
        return False if node.primitive.elementwise else None
    if out.ndim == 0 or out.shape[0] != rows:
        return None
    if node.primitive.elementwise:
        for v in ins:
            if v in batched:
                if v.aval.shape != out.shape:
                    return None
            elif v.aval.ndim == out.ndim and v.aval.shape[0] != 1:
                return None
        return True
    if name == "slice":
        start, strides = node.params["start_indices"][0], node.params["strides"][0]
        return True if start in (None, 0) and strides in (None, 1) else None
    if name == "pad":
        return True if ins[0] in batched and ins[1] not in batched and tuple(
            node.params["config"][0]) == (0, 0, 0) else None
    if name == "concatenate":
        axis = node.params["axis"] % out.ndim
        return True if axis != 0 and all(v in batched for v in ins) else None
    return None


def plan(body, n_carry, n_xs):
    """(rows, align, multiply-adds per row of its smallest product) of a
    scan body (its traced Graph) whose rows never meet, or None."""
    inputs = body.inputs[:n_carry + n_xs]
    if not inputs or any(v.aval.ndim == 0 or not v.aval.is_static() for v in inputs):
        return None
    rows = inputs[0].aval.shape[0]
    if any(v.aval.shape[0] != rows for v in inputs):
        return None
    batched = set(inputs)
    products = []
    for node in body.nodes:
        if node.primitive.name == "dot_general":
            product = _row_product(node, rows, batched)
            if product is None:
                if any(v in batched for v in node.inputs):
                    return None
                continue
            products.append(product)
            batched.add(node.outputs[0])
            continue
        passes = _rows_pass(node, rows, batched)
        if passes is None:
            return None
        if passes:
            batched.add(node.outputs[0])
    if not products or any(type(v) is Literal or v not in batched for v in body.outputs):
        return None
    align = 1
    for dtype in {dtype for dtype, _ in products}:
        found = product_pool.rule(dtype)
        if found is None or not found.rows:
            return None
        align = math.lcm(align, found.rows)
    return rows, align, min(per_row for _, per_row in products)


# A row block's cost per time step beyond its rows' work (its loop and its
# body's kernels dispatched from Python, which hold the GIL), in multiply-adds
# of the rows' smallest product. Measured on one core of the AMD VM (issue
# 16, twenty-third pass, s23tail): the benchmark's LSTM cell (batch 128, 128
# units: 65,536 multiply-adds per row) ran a forward scan in 2 / 4 / 8 blocks
# in turn for 155 / 170 / 202 us of CPU per time step, about 8 us more per
# block; its rows' work, about 139 us for 128 rows, puts 8 us at about
# 480,000 multiply-adds of the rows' product.
BLOCK_STEP_MACS = 480_000


def block_count(rows, per_row, threads):
    """How many row blocks (2 .. threads) a scan's time steps run in: the
    fewest with the least wall time per step, max(B o, o + W / B), where
    the B blocks' overhead o (BLOCK_STEP_MACS) takes turns on the GIL and
    each block's rows' work (W / B, W = rows x per_row) runs at once. The
    benchmark's LSTM (W about 17 o) gets 5 blocks of 25-26 rows from 5
    threads up where MIN_BLOCK allowed 8 of 16 (there 8 o of turns against
    2.2 o of work per block: the sixteenth pass's 16-core LSTM used 2.5
    cores of 16). Two threads keep their two blocks."""
    work = rows * per_row

    def wall(count):
        return max(count * BLOCK_STEP_MACS, BLOCK_STEP_MACS + work / count)

    return min(range(2, max(threads, 2) + 1), key=wall)


def edges(rows, align, per_row, count):
    """Row edges of up to `count` blocks, each starting at a multiple of
    `align` and each product's block above OpenBLAS' small-matrix bound
    (product_pool's rule for a product's blocks); None: fewer than two."""
    found = product_pool.side_edges(rows, per_row, 1, count, align)
    return None if found is None else tuple(int(e) for e in found)


def _block_graph(body, n_rows_inputs, lo, hi):
    """The body traced again with its first `n_rows_inputs` inputs (the
    carries and the time step's xs) cut to rows lo:hi."""
    avals = [ShapedArray((hi - lo,) + v.aval.shape[1:], v.aval.dtype)
             if i < n_rows_inputs else v.aval for i, v in enumerate(body.inputs)]
    graph, captures = trace_flat(lambda *xs: eval_graph(body, *xs), avals)
    return None if captures else graph


def compile_blocks(body, n_carry, n_xs, whole, compile_body, donated):
    """RowBlocks of a scan body (its traced Graph), or `whole` (its
    compiled Executable) where its rows meet or one thread is all."""
    threads = host_threads.max_threads()
    behaviour = whole.fp_behaviour
    if threads < 2 or (behaviour is not None and behaviour.active):
        # numerics.py wraps each kernel and counts on the program's order.
        return whole
    planned = plan(body, n_carry, n_xs)
    if planned is None:
        return whole
    rows, align, per_row = planned
    cut = edges(rows, align, per_row, block_count(rows, per_row, threads))
    if cut is None:
        return whole
    blocks = []
    for lo, hi in zip(cut[:-1], cut[1:]):
        graph = _block_graph(body, n_carry + n_xs, lo, hi)
        if graph is None:
            return whole
        with host_threads.capped(1):
            exe = compile_body(graph, donated)
        exe.thread_cap = 1
        blocks.append((lo, hi, exe))
    return RowBlocks(whole, tuple(blocks))


def recopied(body, n_carry):
    """The carries a scan copies before its body writes into them again:
    those the body writes into and did not allocate (a pass-through, a
    view)."""
    return tuple(k for k in range(n_carry)
                 if k in body.written_inputs and not body.owned_outputs[k])


def run_steps(body, steps, carry, xs, consts, recopy, ys, rows=None):
    """The scan's loop: `body` (a stack_slots.StackedBody) at each time
    step of `steps`, its stacked outputs written into `ys` (at [t, rows]
    when `rows`, a slice, is given) by its kernels where placed, else
    copied; returns the final carries. `recopy`: the carries to copy
    before the body writes into them again (results it did not allocate)."""
    run, placed, forwarded, run_last = body
    n_carry = len(carry)
    at = [t if rows is None else (t, rows) for t in steps]
    slotted = [(y, k) for k, (y, p) in enumerate(zip(ys, placed), n_carry) if p]
    ahead = [(y, c, k) for k, (y, c) in enumerate(zip(ys, forwarded), n_carry) if c is not None]
    copied = [(y, k) for k, y in enumerate(ys, n_carry) if not placed or not placed[k - n_carry]]
    written = ()  # the stacked outputs the time step before wrote into this one's slots
    last = len(at) - 1
    for n, t in enumerate(steps):
        slots = [y[at[n]] for y, _ in slotted]
        if n < last and ahead:
            ahead_slots = [y[at[n + 1]] for y, _, _ in ahead]
            outs = run(carry + [x[t] for x in xs] + consts + slots + ahead_slots)
        else:
            ahead_slots = ()
            outs = run_last(carry + [x[t] for x in xs] + consts + slots)
        carry = outs[:n_carry]
        for k in recopy:
            carry[k] = np.array(carry[k])
        for y, k in copied:
            if k not in written:
                y[at[n]] = outs[k]
        for slot, (y, k) in zip(slots, slotted):
            if outs[k] is not slot:  # NumPy's kernel ran: a new array
                y[at[n]] = outs[k]
        # A carry in the next slot goes on as a view of it (its body does
        # not write into it: stack_slots.stacked_body).
        written = [k for slot, (_, c, k) in zip(ahead_slots, ahead) if carry[c] is slot]
    return carry


def block_runner(blocks, n_carry, steps, carry_avals, y_avals):
    """scan(carry, xs, consts) -> (carry..., ys...) running each block's
    loop over the time `steps` on a thread of the pool (the last on the
    caller) and writing its rows of the results."""
    launch, join = host_threads.launch_block, host_threads.join_block
    note = host_threads.note_blocks
    clock, cpu_clock = time.perf_counter, time.thread_time

    def run_block(body, recopy, lo, hi, carry, xs, consts, ys):
        """(the block's final carries, its thread's CPU seconds)."""
        start = cpu_clock()
        # Copies: the block's body updates its carries in place.
        carry = [np.array(c[lo:hi]) for c in carry]
        carry = run_steps(body, steps, carry, [x[:, lo:hi] for x in xs], consts, recopy,
                          ys, slice(lo, hi))
        return carry, cpu_clock() - start

    prepared = tuple((stack_slots.runner(body, n_carry), recopied(body, n_carry), lo, hi)
                     for lo, hi, body in blocks)

    def scan_rows(carry, xs, consts):
        ys = [np.empty(a.shape, a.dtype) for a in y_avals]
        start = clock()
        jobs = [launch(run_block, (*block, carry, xs, consts, ys))
                for block in prepared[:-1]]
        last = run_block(*prepared[-1], carry, xs, consts, ys)
        results = [join(job) for job in jobs] + [last]
        note(clock() - start, sum(cpu for _, cpu in results))
        final = [np.empty(a.shape, a.dtype) for a in carry_avals]
        for (_, _, lo, hi), (block_carry, _) in zip(prepared, results):
            for out, value in zip(final, block_carry):
                out[lo:hi] = value
        return tuple(final) + tuple(ys)

    return scan_rows
