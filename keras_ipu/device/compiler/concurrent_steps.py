"""Independent steps of a program run at the same time on the host.

The NumPy engine runs a program's kernels one after another. Most of a
training step's kernels are too small to split over threads (a batch-32
Dense layer's product: 17 MFLOP, 0.16 ms; Adam's update of a 512x512
weight: 0.5 ms), so with two cores the second one idled, while XLA runs
independent kernels at once (issue 16: JAX at 2 threads ran Keras'
demo_functional 1.5 times as fast as at one, the NumPy engine not at all).
A training step has plenty of independent work: each layer's weight
gradient is read only by its optimizer update at the end of the step,
and the updates of different weights are independent of each other.

So a step whose result is not needed by the step after it is *launched*:
its kernel starts on a pool thread (threads.launch) and the run loop goes
on; a *join* step, placed right before the first later step that
depends on it, waits for it (threads.join). A later step depends on a
launched one when it reads one of its results, when it writes into
(donates, donation.py) one of its operands, when it is not one of the
kernels known to read their operands and allocate (or write only their
donated operands: control flow, effects and the rest join every
launched step first), or when it may split over the pool itself. Steps still running at the end are joined there,
the last launched first: the run loop takes the ones no pool thread has
started, from the back, while the pool works from the front.

Launched: products and native (C) fused chains worth a hand-off
(MIN_LAUNCH_FLOPS, MIN_LAUNCH_ELEMENTS: their kernels release the GIL, so
they run beside the run loop's Python) and not split over threads on their
own (a split kernel has the pool already); but a weight gradient the C
pool would split in two runs whole in one launched job with its
optimizer update where the run loop has work of its own to run
meanwhile (splits_in_two, _caller_work: Keras' demo_functional at batch
32, its 17 MFLOP weight gradients beside the next layers' input
gradients, the last one beside the step's tail of small kernels). Each kernel computes exactly
what it computes alone, on the same operands: the values are the same
bits as in program order. When no pool thread gets a core (a busy
machine) the run loop runs the launched kernel itself at its join; a pool
thread that took it and then lost its core, or a run loop that lost its
own (threads.LATE_WAIT_SECONDS), makes a late split, so the pool's back-off (threads.py) turns launches into plain
calls for a while. Not done with a floating-point behaviour set
(numerics.py wraps each kernel and counts on the program's order), nor
with a cap of one thread.

Only the run loop sees launches and joins (Executable._run_program); the
graph, its costs and profiles, and the kernel list (`_program`) keep one
step per node.
"""

import numpy as np

from keras_ipu.device import native
from keras_ipu.device.native import product_pool
from keras_ipu.device.native import threads as host_threads
from keras_ipu.device.compiler.dot_lowering import product_shape
from keras_ipu.device.compiler.native_fusion import chain_threads
from keras_ipu.device.compiler.update_steps import donated_slots
from keras_ipu.device.compiler.update_steps import is_update

# A launch and its join cost some 10-30 us of the run loop's time and a
# pool thread's wake-up on an idle machine (host_threads.py: the pool's
# round trip); kernels below about 50 us of one core's work are not worth
# it: 4 MFLOP of product at OpenBLAS' ~85 GFLOP/s here, or 32k elements of
# a fused chain (1.5-2.5 ns per element for a chain of a few ops).
MIN_LAUNCH_FLOPS = 4_000_000
MIN_LAUNCH_ELEMENTS = 1 << 15

# Kernels that only read their operands and allocate their results (or
# write into the operands their node donates): a launched step may run
# beside them. Every other primitive (control flow, effects, in-place
# updates, ...) joins all launched steps before it runs.
_PLAIN = frozenset((
    "dot_general", "fused_elementwise", "conv_general_dilated", "reduce_window",
    "reduce_sum", "reduce_max", "reduce_min", "reduce_prod", "reduce_and", "reduce_or",
    "argmax", "argmin", "reshape", "broadcast_to", "transpose", "concatenate", "pad",
    "slice", "rev", "gather", "iota",
))


def product_split(node):
    """(floating-point operations, threads its lowering splits it over:
    threads.product_threads) of a dot_general node; None when a shape is
    not static."""
    lhs, rhs = (v.aval for v in node.inputs)
    if not (lhs.is_static() and rhs.is_static()):
        return None
    b, m, n, k, compute = product_shape(node.params, lhs, rhs)
    return 2 * max(b, 1) * m * n * k, host_threads.product_threads(b, m, n, k, compute)


def worth_launching(node, kernel):
    """Whether the step's kernel is one that runs beside the run loop and
    is large enough for the hand-off, yet not split on its own."""
    name = node.primitive.name
    if name == "dot_general":
        split = product_split(node)
        return split is not None and split[0] >= MIN_LAUNCH_FLOPS and split[1] == 1
    if name == "fused_elementwise" and getattr(kernel, "native", False):
        aval = node.outputs[0].aval
        if not aval.is_static():
            return False
        n = int(np.prod(aval.shape, dtype=np.int64))
        return n >= MIN_LAUNCH_ELEMENTS and chain_threads(node.params["chain"], n) == 1
    return False


def is_plain(node):
    return node.primitive.elementwise or node.primitive.name in _PLAIN


def is_barrier(node):
    """Whether the step joins every launched step before it runs (and runs
    alone): not plain, or it may split over the pool itself."""
    return not is_plain(node) or _may_split(node)


def _may_split(node):
    """Whether the step's kernel may split over the pool itself (a large
    product or convolution, a chain, pad, sum or pooling over at least two
    threads' elements: threads.py, leading_axis.py). Launched steps are
    joined before it: it wants every thread, and a pool thread busy with a
    launched kernel would look like a late helper to its split."""
    name = node.primitive.name
    if name == "conv_general_dilated":
        return True
    if name == "dot_general":
        split = product_split(node)
        return split is None or (split[1] > 1 and not splits_in_a_row_tail(node))
    # A fused chain splits on its own rule (the C pool's: chain_threads).
    if name == "fused_elementwise":
        def threads_for(n):
            return chain_threads(node.params["chain"], n)
    else:
        threads_for = host_threads.threads_for_elements
    for v in node.outputs:
        if not v.aval.is_static():
            return True
        if threads_for(int(np.prod(v.aval.shape, dtype=np.int64))) > 1:
            return True
    return False


def splits_in_a_row_tail(node):
    """Whether a product splits in its aligned rows and its row tail
    (threads.row_tail_split: Keras' demo_functional's 32x512 @ 512x512 in
    24 and 8 rows). Such a split gains only with the helper free, a
    fraction of the product's time: where a launched job holds the helper
    it runs on one thread instead of joining the job (_launched), so it
    is no barrier."""
    if node.primitive.name != "dot_general":
        return False
    lhs, rhs = (v.aval for v in node.inputs)
    if not (lhs.is_static() and rhs.is_static()):
        return False
    b, m, n, k, compute = product_shape(node.params, lhs, rhs)
    return (not b and host_threads.product_threads(b, m, n, k, compute) == 2
            and host_threads.row_tail_split(m, n, k, compute) is not None)


def _launch_step(step):
    kernel, ins, out, multi, frees = step
    start = getattr(kernel, "start_on_c_pool", None)
    if start is None and getattr(kernel, "native", False):  # a C chain alone
        start = _c_pool_start(None, kernel, 0, ())
    elif start is None and hasattr(kernel, "operands"):  # a product alone
        start = _product_start(kernel)
    if start is None:
        launch = host_threads.launch

        def launched(*xs):
            job = launch(kernel, xs)
            return [job] * len(out) if multi else job
    else:
        launch_on_c_pool = host_threads.launch_on_c_pool

        def launched(*xs):
            job = launch_on_c_pool(start, kernel, xs)
            return [job] * len(out) if multi else job

    launched.launched = kernel
    return (launched, ins, out, multi, frees)


def _join_step(step):
    _, _, out, multi, _ = step
    join = host_threads.join

    def joined(pending):
        return join(pending)

    # The handle sits in every result slot of the launched step; the join
    # reads it from the first and puts the results in all of them.
    return (joined, (out[0] if multi else out,), out, multi, ())


def _update_alone(node, kernel):
    """The one-thread kernel of an in-place update (early_updates.py) a
    launched product's job may run after the product, or None: a native
    chain only (its loop releases the GIL; a NumPy chain's Python would
    hold the run loop)."""
    if not (getattr(kernel, "native", False) and is_update(node)):
        return None
    return getattr(kernel, "one_thread", None)


def splits_in_two(node, kernel):
    """Whether a product splits over two threads with one thread's bits
    (the C pool's: its kernel has `one_thread`, dot_lowering.py) and is
    worth a launch: in a launched job with its update (pairs_with) it runs
    whole on one of the two threads while the run loop goes on with the
    next steps on the other, one hand-off where the split takes two."""
    if node.primitive.name != "dot_general" or getattr(kernel, "one_thread", None) is None:
        return False
    split = product_split(node)
    return split is not None and split[0] >= MIN_LAUNCH_FLOPS and split[1] == 2


def pairs_with(program, nodes, j, i, n_inputs):
    """Whether update step j may run in the same launched job as product
    step i: i is worth launching (or splits in two: splits_in_two), j
    reads its result (its gradient) and is the last to, has a one-thread
    kernel, and writes only into the program's inputs besides (an
    optimizer's variables: nothing else in the program reads them after
    it, so the job runs beside the rest)."""
    kernel, _, out, multi, _ = program[i]
    _, ins, _, _, frees = program[j]
    written = donated_slots(program[j], nodes[j]) - {out}
    return (not multi and nodes[i].primitive.name == "dot_general"
            and (worth_launching(nodes[i], kernel) or splits_in_two(nodes[i], kernel))
            and out in ins and out in frees
            and all(s < n_inputs for s in written)
            and _update_alone(nodes[j], program[j][0]) is not None)


def _paired_step(product, update, alone):
    """One step running the product and then, on its result, the update's
    one-thread kernel `alone` (what each computes alone: the same bits).
    A product that splits runs on the job's thread alone (its `one_thread`),
    and the job, launched, backs off as the split would (threads.launch)."""
    kernel, ins, out, _, frees = product
    split_alone = getattr(kernel, "one_thread", None)
    if split_alone is not None:
        kernel = split_alone
    _, update_ins, update_out, multi, update_frees = update
    rest = tuple(s for s in update_ins if s != out)
    at = tuple(k for k, s in enumerate(update_ins) if s == out)
    n = len(ins)

    def paired(*xs):
        args = list(xs[n:])
        result = kernel(*xs[:n])
        for k in at:  # ascending: each lands where the update reads it
            args.insert(k, result)
        return alone(*args)

    paired.stands_for_a_split = split_alone is not None
    start = _c_pool_start(product[0], update[0], n, at)
    if start is not None:
        paired.start_on_c_pool = start
    freed = tuple(sorted((set(frees) | set(update_frees)) - {out}))
    return (paired, ins + rest, update_out, multi, freed)


def _finisher(join_pair, pick):
    """finish(handle) of a C-pool start: the launched job joined
    (join_pair's statistics), then its results as `pick` gives them."""

    def finish(handle):
        job, outs = handle
        stats = join_pair(job)
        return pick(outs), stats

    return finish


def _product_start(product):
    """xs -> a launch of the product step alone as a job of the C pool
    (its one np.matmul call in C: _elementwise.launch_product), as
    _c_pool_start; None where there is no C pool."""
    elementwise = native.elementwise
    if (elementwise is None or not hasattr(elementwise, "launch_product")
            or not product_pool.tasks_available()):
        return None
    operands, (shape, dtype) = product.operands, product.result_shape
    empty, launch_product = np.empty, elementwise.launch_product
    finish = _finisher(elementwise.join_pair, lambda result: result)

    def start(x, y):
        result = empty(shape, dtype)
        job = launch_product(*operands(x, y), result)
        return ((job, result), finish) if job is not None else None

    return start


# A pair's product result (a weight gradient) is read by its update
# alone (pairs_with: the update frees it), so the C job may write it into
# a buffer its thread reuses for every pair, still in its caches, instead
# of a new array that comes in cold (_elementwise.c pair_task). False:
# into the new array, as before (benchmarks compare the two).
REUSED_GRADIENT = True


def _c_pool_start(product, chain, n, at):
    """xs -> a launch of the step as one job of the C pool
    (threads.launch_on_c_pool, _elementwise.launch_pair): the product's one
    np.matmul call on xs[:n] (none where `product` is None), its result
    at positions `at` of the chain's operands, then the chain on one
    thread, in C, with no Python and no GIL between them, where a job on a
    Python thread took the GIL back after the product and around the
    chain's call (issue 16, twelfth pass). The same calls on the same
    operands: the bits of the step run in place. None where a part cannot
    run so (a product with a cast or a reshape, a chain NumPy runs or that
    splits, no C pool)."""
    elementwise = native.elementwise
    operands = None if product is None else getattr(product, "operands", None)
    call = getattr(chain, "one_thread_call", None)
    if ((product is not None and operands is None) or call is None or elementwise is None
            or not hasattr(elementwise, "launch_pair") or not product_pool.tasks_available()
            or (product is None and getattr(chain, "one_thread", None) is not chain)):
        return None
    code, size, inner, block, loops, alloc, pick = call
    empty, launch_pair = np.empty, elementwise.launch_pair
    finish = _finisher(elementwise.join_pair, pick)

    if product is None:
        def start(*xs):
            outs = alloc(xs)
            job = launch_pair(None, None, None, code, size, inner, block, xs, outs, loops)
            # None or False: the C kernels refused an operand and nothing ran.
            return ((job, outs), finish) if job else None

        return start
    shape, dtype = product.result_shape

    def start(*xs):
        x, y = operands(*xs[:n])
        result = empty(shape, dtype)
        args = list(xs[n:])
        for k in at:  # ascending: each lands where the update reads it
            args.insert(k, result)
        args = tuple(args)
        outs = alloc(args)
        job = launch_pair(x, y, result, code, size, inner, block, args, outs, loops,
                          REUSED_GRADIENT)
        return ((job, outs), finish) if job else None

    return start


def _paired(program, nodes, n_inputs, kept_apart=()):
    """(steps, donated slots per step, barrier per step, launch per step,
    {step: product's index} of the pairs, the steps that are products
    split in a row tail: splits_in_a_row_tail) with each update that follows
    the product making its gradient (early_updates.py put it there)
    joined to it in one step, launched; but the products in `kept_apart`."""
    steps, writes, barrier, launch, pairs, tails = [], [], [], [], {}, set()
    i, n = 0, len(program)
    while i < n:
        step, node = program[i], nodes[i]
        if (i + 1 < n and i not in kept_apart
                and pairs_with(program, nodes, i + 1, i, n_inputs)):
            pairs[len(steps)] = i
            update = program[i + 1]
            alone = _update_alone(nodes[i + 1], update[0])
            steps.append(_paired_step(step, update, alone))
            writes.append(donated_slots(update, nodes[i + 1]) - {step[2]})
            barrier.append(False)  # the update runs on the job's thread only
            launch.append(True)
            i += 2
            continue
        if splits_in_a_row_tail(node) and getattr(step[0], "one_thread", None) is not None:
            tails.add(len(steps))
        steps.append(step)
        writes.append(donated_slots(step, node))
        barrier.append(is_barrier(node))
        launch.append(worth_launching(node, step[0]))
        i += 1
    return steps, writes, barrier, launch, pairs, tails


# What the run loop's own steps beside a launched pair are worth, in a
# product's floating-point operations (_caller_work): in the step a small
# kernel costs some 10 us whatever its size (the run loop's call, a cache
# the products before it swept: Keras' demo_functional's 512-element bias
# updates 9-24 us, a row sum 7-13 us), about 0.6 MFLOP of a 32x512 @
# 512x512 product there (17 MFLOP in 0.25-0.33 ms); and a chain or a sum
# some 2 ns per element, 120 FLOPs. Measured on the 2-core AMD VM (issue
# 16, thirteenth pass, s13demo): demo_functional's last 512x512 weight
# gradient (its step's tail: one 3 MFLOP product, 14 small kernels) split
# in two, then its update split, 9.15-9.17 ms median per step; launched
# whole with its update beside the tail, 8.70-8.75.
STEP_FLOPS = 600_000
ELEMENT_FLOPS = 120


def _caller_work(program, nodes, pairs, launched, i, first):
    """What the run loop runs itself (not launched) between step i and
    `first` (positions in the paired program, `pairs` as _paired gives
    them: each other step is one node, in order), in a product's FLOPs:
    its products' FLOPs, and STEP_FLOPS plus ELEMENT_FLOPS per element
    (its largest operand or result) for each other step."""
    work, node_of = 0, 0
    for p in range(first):
        node = nodes[pairs.get(p, node_of)]
        node_of = pairs[p] + 2 if p in pairs else node_of + 1
        if not i < p or p in launched:
            continue
        if node.primitive.name == "dot_general":
            split = product_split(node)
            work += split[0] if split is not None else 0
        else:
            avals = [v.aval for v in (*node.inputs, *node.outputs)
                     if hasattr(v, "aval") and v.aval.is_static()]
            elements = max((int(np.prod(a.shape, dtype=np.int64)) for a in avals), default=1)
            work += STEP_FLOPS + ELEMENT_FLOPS * elements
    return work


def concurrent_program(program, nodes, n_inputs=0):
    """The run loop's steps: `program` (one step per node) with steps
    worth running beside the next ones launched and joined before their
    first dependent (module doc), an update right after its gradient's
    product launched with it (pairs_with: into the first `n_inputs` slots,
    the program's inputs). A product that splits in two pairs so only
    where the run loop has work of at least half its FLOPs to run before
    the join (splits_in_two, _caller_work): elsewhere it splits as before. For
    a cap of at least two threads: the caller (executable.run_program)
    decides, as it orders the updates for it."""
    kept_apart = set()
    while True:
        steps, launched, joins_before, pairs = _launched(program, nodes, n_inputs, kept_apart)
        lonely = set()
        for p, i in pairs.items():
            if not splits_in_two(nodes[i], program[i][0]):
                continue
            first = next((k for k, js in enumerate(joins_before) if p in js), None)
            if (p not in launched or 2 * _caller_work(program, nodes, pairs, launched, p, first)
                    < product_split(nodes[i])[0]):
                lonely.add(i)
        if not lonely:
            break
        kept_apart |= lonely
    if not launched:
        return tuple(steps)
    run = []
    for i in range(len(steps) + 1):
        # The last launched first (module doc).
        run.extend(_join_step(steps[k]) for k in sorted(joins_before[i], reverse=True))
        if i < len(steps):
            run.append(_launch_step(steps[i]) if i in launched else steps[i])
    return tuple(run)


def _launched(program, nodes, n_inputs, kept_apart):
    """(steps, launched positions, joins before each position, pairs) of
    the paired program (_paired)."""
    program, writes, barrier, launch, pairs, tails = _paired(program, nodes, n_inputs, kept_apart)
    n = len(program)
    reads_of = [set(step[1]) for step in program]
    joins_before = [[] for _ in range(n + 1)]
    launched = set()
    for i, step in enumerate(program):
        kernel, ins, out, multi, frees = step
        outs = set(out) if multi else {out}
        # A result nobody reads is freed at once: its slot could be reused
        # before the join reads the handle from it.
        if outs & set(frees) or not launch[i]:
            continue
        reads = reads_of[i]
        first = n
        for j in range(i + 1, n):
            if barrier[j] or outs & reads_of[j] or reads & writes[j]:
                first = j
                break
        if first > i + 1:  # something to run beside it
            launched.add(i)
            joins_before[first].append(i)
    # A product split in a row tail while a launched job holds the helper
    # runs on one thread (splits_in_a_row_tail).
    pending = set()
    for j in range(n):
        pending -= set(joins_before[j])
        if j in tails and pending:
            kernel, *rest = program[j]
            program[j] = (kernel.one_thread, *rest)
        if j in launched:
            pending.add(j)
    return program, launched, joins_before, pairs
