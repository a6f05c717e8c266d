"""Fused elementwise chains run by the C kernel (native/_elementwise.c).

The NumPy kernel of a fused chain (fusion.py) makes one pass over memory
per step; the C kernel runs the whole chain block by block, one pass in all.
A chain qualifies when the C kernel computes exactly what NumPy does:
float32 and bool values, operations whose IEEE result is correctly
rounded (add, sub, mul, div, sqrt, ...), comparisons, selects and the
float32 <-> bool conversions, every step of the output's shape, and each
operand either of that shape, a scalar, a row repeated along the leading
axes (a bias) or a column repeated along the trailing ones (a per-row
statistic). Transcendentals (exp, log, tanh, the logistic function, any
float32 unary primitive whose kernel is a NumPy ufunc) qualify through
NumPy's own loops: NumPy's SIMD versions round differently from libm's, so
the C kernel calls the loop NumPy's ufunc runs (numpy_loops.py), block by
block, and gets its bits. A few chains models emit (Keras' Adam update, a
Dense layer's bias + ReLU, a transformer block's softmax and LayerNorm)
have their own loop in the C kernel, found by matching the program this
module builds word for word (_elementwise.c's WHOLE_CHAINS).

At run time a full-size operand whose rows lie apart (a column slice's
view, such as an LSTM cell's gates cut from one product) is read in place,
the C kernel gathering each block's rows; any other strided operand is
copied first; the kernel falls back to the NumPy one when an operand does
not fit (another dtype or size), before writing anything.
"""

import math

import numpy as np

from keras_ipu.device.native import product_pool
from keras_ipu.device.native import threads as host_threads

from keras_ipu.device import native
from keras_ipu.device.compiler.host_memory import empty_aligned
from keras_ipu.device.compiler.lowering import fast_ufunc
from keras_ipu.device.compiler.numpy_loops import float32_loop
from keras_ipu.device.primitives import elementwise as ew
from keras_ipu.device.primitives.convert import convert_element_type_p

F32 = np.dtype(np.float32)
BOOL = np.dtype(np.bool_)
_DTYPE_CODE = {F32: 0, BOOL: 1}
FULL, SCALAR, ROW, COL = 0, 1, 2, 3

# Opcodes of _elementwise.c, by primitive and operand dtypes. Only
# primitives whose results are correctly rounded (their `ieee_exact` fact)
# have one: the C loop then gives NumPy's bits.
_F32_BINARY = {ew.add_p: 1, ew.sub_p: 2, ew.mul_p: 3, ew.div_p: 4, ew.max_p: 5,
               ew.min_p: 6}
_F32_UNARY = {ew.neg_p: 7, ew.abs_p: 8, ew.sqrt_p: 9, ew.square_p: 10,
              ew.reciprocal_p: 11, ew.floor_p: 12, ew.ceil_p: 13}
_COMPARE = {ew.gt_p: 14, ew.ge_p: 15, ew.lt_p: 16, ew.le_p: 17, ew.eq_p: 18,
            ew.ne_p: 19}
_BOOL_BINARY = {ew.and_p: 20, ew.or_p: 21, ew.xor_p: 22}
_NOT, _SELECT_F, _SELECT_B, _F2B, _B2F = 23, 24, 25, 26, 27
_SQRT, _RECIP = _F32_UNARY[ew.sqrt_p], _F32_UNARY[ew.reciprocal_p]
# NumPy's float32 loop k of the kernel's `loops` (a unary ufunc), and the
# logistic function on the exp loop k (_elementwise.c).
_LOOP, _LOGISTIC = 64, 128

# How a result reaches its output buffer (_elementwise.c): copied at the
# end of each block, written there by its step, or copied with
# non-temporal stores.
_OUT_COPY, _OUT_DIRECT, _OUT_STREAM = 0, 1, 2

# Block size: the chain's registers (block x 4 bytes each) stay within
# about half of a 1 MiB L2; above a few thousand elements a longer block
# saves nothing, below a few hundred the per-op call costs show.
_SCRATCH_BYTES = 256 * 1024
_MIN_BLOCK, _MAX_BLOCK = 256, 4096
# A repeated row longer than this would make the blocks too large.
_MAX_INNER = 16384


def _steps(prim, in_dtypes, out_aval, loops):
    """[(opcode, reads the step's operands (True) or the previous op's
    result (False))] computing this step exactly, or None. NumPy loops it
    needs are appended to `loops` (ufuncs; their index is in the opcode)."""
    out_dtype = out_aval.dtype
    if in_dtypes == (F32,) and out_dtype == F32:
        if prim is ew.rsqrt_p:  # its kernel: reciprocal(sqrt(x)), both exact
            return [(_SQRT, True), (_RECIP, False)]
        if prim is ew.logistic_p:
            return _loop_step(np.exp, _LOGISTIC, loops)
        ufunc = None if prim.ieee_exact else fast_ufunc(prim, (out_aval,), out_aval)
        if ufunc is not None and ufunc.nin == 1:
            return _loop_step(ufunc, _LOOP, loops)
    if prim is ew.logical_not_p and in_dtypes == (BOOL,):
        return [(_NOT, True)]  # on bools np.logical_not is `not` (a max pool's gradient)
    opcode = _opcode(prim, in_dtypes, out_dtype)
    return None if opcode is None else [(opcode, True)]


def _loop_step(ufunc, base, loops):
    if float32_loop(ufunc) is None:
        return None
    if ufunc not in loops:
        loops.append(ufunc)
    return [(base + loops.index(ufunc), True)]


def _opcode(prim, in_dtypes, out_dtype):
    """The C opcode computing this step exactly, or None."""
    if not prim.ieee_exact:
        return None
    if prim in _COMPARE and in_dtypes == (F32, F32):
        return _COMPARE[prim]
    if out_dtype == F32:
        if prim in _F32_BINARY and in_dtypes == (F32, F32):
            return _F32_BINARY[prim]
        if prim in _F32_UNARY and in_dtypes == (F32,):
            return _F32_UNARY[prim]
        if prim is ew.select_p and in_dtypes == (BOOL, F32, F32):
            return _SELECT_F
        if prim is convert_element_type_p and in_dtypes == (BOOL,):
            return _B2F
    elif out_dtype == BOOL:
        if prim in _BOOL_BINARY and in_dtypes == (BOOL, BOOL):
            return _BOOL_BINARY[prim]
        if prim is ew.not_p and in_dtypes == (BOOL,):
            return _NOT
        if prim is ew.select_p and in_dtypes == (BOOL, BOOL, BOOL):
            return _SELECT_B
        if prim is convert_element_type_p and in_dtypes == (F32,):
            return _F2B
    return None


def _mode(shape, out_shape):
    """(mode, inner length) of an operand of `shape` in a result of
    `out_shape`, or None when it broadcasts some other way."""
    if math.prod(shape) == 1:
        return SCALAR, 1
    padded = (1,) * (len(out_shape) - len(shape)) + tuple(shape)
    if padded == tuple(out_shape):
        return FULL, 1
    for k in range(1, len(out_shape)):
        inner = math.prod(out_shape[k:])
        if all(d == 1 for d in padded[:k]) and padded[k:] == tuple(out_shape[k:]):
            return ROW, inner
        if padded[:k] == tuple(out_shape[:k]) and all(d == 1 for d in padded[k:]):
            return COL, inner
    return None


def _block_size(n_regs, inner):
    target = _SCRATCH_BYTES // (4 * max(n_regs, 1))
    target = min(max(target, _MIN_BLOCK), _MAX_BLOCK)
    return max(inner, (target // inner) * inner)


def _nearest_operand(chain, j, candidates):
    """The candidate operand step j reads most directly (breadth first
    through the steps it reads), else the first candidate, else None: the
    new weights `w + update` go into the old weights' buffer, as a donated
    state update does in XLA, rather than into some other dead operand."""
    queue, seen = [j], set()
    while queue:
        step = queue.pop(0)
        for kind, k, _ in chain[step][2]:
            if kind == "in" and k in candidates:
                return k
            if kind == "t" and k not in seen:
                seen.add(k)
                queue.append(k)
    return candidates[0] if candidates else None


def plan(chain, results, in_avals, donate=(), streamed=()):
    """The C program of a fused chain, or None if it does not qualify.

    `streamed`: positions in `results` of results nothing reads after the
    chain (returned by the program): a fresh buffer for one is written with
    non-temporal stores (_elementwise.c's stream mode).

    Returns (code, n, inner, block, allocations, result_index, loops) where
    allocations[i] = (donated operand index or None, dtype) for each distinct
    output buffer, result_index maps each result to its buffer, and loops
    are the NumPy ufuncs whose float32 loops the code calls.
    """
    if not results:
        return None
    shape = tuple(chain[results[0]][3].shape)
    n = math.prod(shape)
    if n == 0 or any(tuple(step[3].shape) != shape for step in chain):
        return None
    modes, inner = [], 1
    for aval in in_avals:
        if aval.dtype not in _DTYPE_CODE:
            return None
        mode = _mode(tuple(aval.shape), shape)
        if mode is None:
            return None
        if mode[0] in (ROW, COL):
            if inner not in (1, mode[1]) or mode[1] > _MAX_INNER:
                return None  # two different repeat lengths: not one block walk
            inner = mode[1]
        modes.append(mode[0])
    n_in = len(in_avals)
    reg_dtypes = [_DTYPE_CODE[a.dtype] for a in in_avals]
    reg_of_step, ops, loops = [], [], []
    for prim, _, refs, aval in chain:
        operands = [k if kind == "in" else reg_of_step[k] for kind, k, _ in refs]
        in_dtypes = tuple(r[2].dtype for r in refs)
        if aval.dtype not in _DTYPE_CODE:
            return None
        if prim is convert_element_type_p and in_dtypes == (aval.dtype,):
            reg_of_step.append(operands[0])  # same dtype: the value itself
            continue
        steps = _steps(prim, in_dtypes, aval, loops)
        if steps is None:
            return None
        operands += [operands[0]] * (3 - len(operands))
        for opcode, reads_operands in steps:
            dst = len(reg_dtypes)
            reg_dtypes.append(_DTYPE_CODE[aval.dtype])
            ops.append((opcode, dst, *(operands if reads_operands else [dst - 1] * 3)))
        reg_of_step.append(dst)
    last_read = {}  # register -> index of the last op reading it
    for i, op in enumerate(ops):
        for reg in op[2:]:
            last_read[reg] = i
    out_regs, allocations, result_index, buffer_of_reg = [], [], [], {}
    # An operand that is itself a result (a same-dtype convert of it) is
    # copied out at the end of each block: nothing may overwrite it.
    aliased = {reg_of_step[j] for j in results if reg_of_step[j] < n_in}
    free_donated = [
        k for k in donate
        if modes[k] == FULL and tuple(in_avals[k].shape) == shape and k not in aliased
    ]
    for position, j in enumerate(results):
        reg = reg_of_step[j]
        if reg not in buffer_of_reg:
            dtype = chain[j][3].dtype
            candidates = [k for k in free_donated if in_avals[k].dtype == dtype]
            into = _nearest_operand(chain, j, candidates)
            if into is not None:
                free_donated.remove(into)
            buffer_of_reg[reg] = len(allocations)
            allocations.append((into, dtype))
            # Written in place unless a later op still reads the donated
            # operand it overwrites (reg - n_in is the op that makes it).
            direct = reg >= n_in and (
                into is None or last_read.get(into, -1) <= reg - n_in
            )
            if into is None and position in streamed:
                mode = _OUT_STREAM
            else:
                mode = _OUT_DIRECT if direct else _OUT_COPY
            out_regs += [reg, mode]
        result_index.append(buffer_of_reg[reg])
    words = [n_in, len(reg_dtypes), len(ops), len(out_regs) // 2]
    for mode, code in zip(modes, reg_dtypes):
        words += [mode, code]
    words += reg_dtypes
    for op in ops:
        words += op
    words += out_regs
    code = np.asarray(words, dtype=np.int32).tobytes()
    block = _block_size(len(reg_dtypes), inner)
    return code, n, inner, block, tuple(allocations), tuple(result_index), tuple(loops)


def _contiguous(xs):
    """The operands with each strided one the C kernel refused (a view
    that is not 2-d rows apart: every other element, a transpose) copied
    into a C-contiguous array: one pass, where the NumPy kernel would make
    one per step. The
    values do not change, and NumPy's loops give the same bits on a view as
    on its copy (tests/compiler/test_native_transcendentals.py)."""
    return tuple(
        np.ascontiguousarray(x) if type(x) is np.ndarray and not x.flags.c_contiguous else x
        for x in xs
    )


def _allocator(makers, allocations, shape):
    """xs -> the chain's output buffers: fresh arrays (makers[k]) or the
    donated operands xs[into]. One output (most chains) without a loop:
    this runs once per kernel call."""
    specs = tuple((make, into, dtype) for make, (into, dtype) in zip(makers, allocations))
    if len(specs) == 1:
        ((make, into, dtype),) = specs
        if make is None:
            return lambda xs: (xs[into],)
        return lambda xs: (make(shape, dtype),)
    return lambda xs: tuple([xs[into] if make is None else make(shape, dtype)
                             for make, into, dtype in specs])


def _picker(result_index, n_buffers):
    """outs -> the chain's results (result_index: a buffer per result)."""
    if tuple(result_index) == tuple(range(n_buffers)):
        return lambda outs: outs
    index = tuple(result_index)
    return lambda outs: tuple([outs[i] for i in index])


def loop_calls(chain):
    """How many steps of the chain call one of NumPy's loops (a
    transcendental): what weighs its split (threads.chain_threads)."""
    loops, calls = [], 0
    for prim, _, refs, aval in chain:
        steps = _steps(prim, tuple(r[2].dtype for r in refs), aval, loops) or ()
        calls += sum(1 for opcode, _ in steps if opcode >= _LOOP)
    return calls


def chain_threads(chain, n):
    """Threads the C kernel of `chain` over `n` elements splits over
    (wider on a host of wide splits: threads.wide_splits)."""
    return host_threads.chain_threads(n, loop_calls(chain), wide=True)


def native_kernel(chain, results, in_avals, donate, fallback, aligned=(), streamed=()):
    """A kernel running the chain in C, or None (use `fallback`, the NumPy
    kernel with the same signature and donations). The results at the
    positions `aligned` (those the program returns) get buffers from
    host_memory.empty_aligned; those at `streamed` (returned, and read by
    nothing after the chain) are written there with non-temporal stores."""
    if native.elementwise is None:
        return None
    planned = plan(chain, results, in_avals, donate, streamed)
    if planned is None:
        return None
    code, n, inner, block, allocations, result_index, ufuncs = planned
    loops = tuple(float32_loop(u) for u in ufuncs)  # held: NumPy ties them to these
    run = native.elementwise.run
    shape = tuple(chain[results[0]][3].shape)
    aligned_buffers = {result_index[k] for k in aligned}
    # Per output buffer: the function allocating it, or None (a donated operand's).
    makers = tuple(
        None if into is not None else empty_aligned if k in aligned_buffers else np.empty
        for k, (into, _) in enumerate(allocations)
    )

    alloc = _allocator(makers, allocations, shape)
    pick = _picker(result_index, len(allocations))
    threads = chain_threads(chain, n)
    parts = host_threads.ranges(n, block, threads)
    if len(parts) > 1 and product_pool.tasks_available():
        # Large chains on the C pool: one call, element ranges of `task`
        # run by the caller and the pool's C threads; ranges are disjoint
        # and every op is elementwise, so the bits are one pass's.
        task = parts[0][1]  # ranges() rounds it to whole blocks
        split_run = host_threads.split_kernel(run, threads, len(parts), task)

        def run_all(xs, outs):
            return split_run(code, n, inner, block, xs, outs, 0, -1, loops) is not False
    elif len(parts) > 1:
        # Large chains on several threads: each call computes its own
        # element range (the C loop releases the GIL); ranges are
        # disjoint and every op is elementwise, so they never interact.
        parallel_for = host_threads.parallel_for

        def run_all(xs, outs):
            ok = []

            def part(i):
                lo, hi = parts[i]
                ok.append(run(code, n, inner, block, xs, outs, lo, hi, loops))

            parallel_for(part, len(parts), threads)
            # Every call checks the same buffers first: all agree.
            return all(ok)
    else:
        def run_all(xs, outs):
            return run(code, n, inner, block, xs, outs, 0, -1, loops)

    def retried(xs):
        """After the C kernel refused the operands (it checks them before
        writing anything): strided ones copied, then NumPy's kernel."""
        xs = _contiguous(xs)
        outs = alloc(xs)
        if run_all(xs, outs):
            return pick(outs)
        return fallback(*xs)

    if len(parts) > 1:
        def fused_native(*xs):
            outs = alloc(xs)
            if run_all(xs, outs):
                return pick(outs)
            return retried(xs)
    else:  # the common case, one call without the run_all hop
        def fused_native(*xs):
            outs = alloc(xs)
            if run(code, n, inner, block, xs, outs, 0, -1, loops):
                return pick(outs)
            return retried(xs)

    if len(parts) > 1:
        def one_thread(*xs):
            """The chain on the caller's thread alone (a launched job's:
            concurrent_steps.py), its bits those of the split."""
            outs = alloc(xs)
            if run(code, n, inner, block, xs, outs, 0, -1, loops):
                return pick(outs)
            xs = _contiguous(xs)
            outs = alloc(xs)
            if run(code, n, inner, block, xs, outs, 0, -1, loops):
                return pick(outs)
            return fallback(*xs)
    else:
        one_thread = fused_native
    n_operands = len(in_avals)
    # Results whose buffer holds them alone, and of those the ones whose
    # buffer is new (not a donated operand's).
    alone = frozenset(p for p, b in enumerate(result_index) if result_index.count(b) == 1)
    placeable = frozenset(p for p in alone if makers[result_index[p]] is not None)

    def placed(positions, over_donated=False):
        """The kernel f(*xs, *dests) writing its results at `positions`
        into `dests` (a scan's stacking slots: stack_slots.py) in place of
        new arrays; or None where such a result's buffer is an operand's
        (unless `over_donated`: the donated operand's buffer is then left
        as it was, which nothing reads after the chain) or holds another
        result too. The same bits: only where the C kernel stores them
        changes. Operands or slots the C kernel refuses get fused_native's
        arrays (the caller then copies them)."""
        buffers = [result_index[p] for p in positions]
        if len(set(positions)) < len(positions) or not (
                alone if over_donated else placeable).issuperset(positions):
            return None
        into_dest = {b: d for d, b in enumerate(buffers)}
        specs = tuple((into_dest.get(k), make, into, dtype)
                      for k, (make, (into, dtype)) in enumerate(zip(makers, allocations)))

        def fused_into(*args):
            xs, dests = args[:n_operands], args[n_operands:]
            outs = tuple([dests[d] if d is not None else xs[into] if make is None
                          else make(shape, dtype) for d, make, into, dtype in specs])
            if run_all(xs, outs):
                return pick(outs)
            return fused_native(*xs)

        return fused_into

    fused_native.placed = placed
    fused_native.placeable = placeable
    fused_native.placeable_over_donated = alone
    fused_native.one_thread = one_thread
    # What a job on the C pool needs to run the chain on one thread, as
    # one_thread does, after a product or alone (concurrent_steps._c_pool_start).
    fused_native.one_thread_call = (code, n, inner, block, loops, alloc, pick)
    fused_native.source = fallback.source
    fused_native.native = True
    # The C kernel's own loop for this chain (an optimizer's update, a
    # bias + ReLU: one pass computing each element), or None (the block loop).
    whole_chain = getattr(native.elementwise, "whole_chain", None)  # None: a stale build
    fused_native.whole_chain = whole_chain(code) if whole_chain else None
    return fused_native
