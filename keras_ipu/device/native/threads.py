"""How many threads the NumPy engine's kernels use, decided per kernel.

OpenBLAS' own threading is wrong for compiled programs in two ways: it
splits every product above a tiny size across all cores (a batch-32
Dense layer's product costs more to hand out than to compute), and its
idle workers spin for a while after each call before they sleep, taking a
core from any other process that wants it (measured in issue 16: under
one busy process, 48 ms per step with default threads, 18 ms with one).

So, when the first program is lowered, OpenBLAS is set to one thread
(threadpoolctl) and the compiled kernels decide themselves: a kernel
whose work is worth it is split into row (or column, batch) blocks, run
by a small pool of our own threads together with the caller. Blocks are
handed out one at a time, so a thread the OS does not schedule (a busy
machine) delays nothing: the others take its blocks. Idle pool threads
block on a queue; nothing spins. A float32 or float64 product (2-d or
batched), a C fused chain and a wide row sum run on the C pool
(product_pool.py, _product_pool.c: C threads, no interpreter lock from
the hand-out to the join, the one-thread bits) wherever it is built
(products: and NumPy's OpenBLAS is found) and `KERAS_IPU_PRODUCT_POOL` is
not 0. Without it, on
a host of BLAS_MIN_CAP threads or more, a 2-d product worth splitting
runs on OpenBLAS' own threads instead, their count set for that call
only (blas_matmul_plan): our Python pool's helpers take turns on the GIL
for every block, which on 16 cores cost more than the split of a
sub-millisecond product gained (issue 16).

Caps, in order: `KERAS_IPU_HOST_THREADS`, then `OPENBLAS_NUM_THREADS`,
`OMP_NUM_THREADS`, `MKL_NUM_THREADS` (the usual variables; the smallest
set one wins), then the cores this process may run on
(`os.sched_getaffinity`). With a cap of 1 everything runs on the caller's
thread. A BLAS variable the user set is a cap on this policy, not
OpenBLAS' own thread count: OpenBLAS stays on one thread whatever it says.
Measured in issue 16 on 16 cores with `OPENBLAS_NUM_THREADS=N` kept by
OpenBLAS: each of our blocks ran on N more OpenBLAS threads that spin
after every call, and the CPU time of a step grew with N (the MLP's 5 ms
at N=1, 34 at 8, 111 at 16) while its speed did not.
"""

import contextlib
import os
import queue
import threading
import time

import numpy as np

from keras_ipu.device.flags import env_switch
from keras_ipu.device.native import FLOAT_DTYPES, product_pool

CAP_VARIABLES = (
    "KERAS_IPU_HOST_THREADS",
    "OPENBLAS_NUM_THREADS",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
)
# Floating-point operations per thread below which a product stays on one
# thread: about 0.35 ms of one core's sgemm (~90 GFLOP/s here). Handing
# out and joining a block costs some 20 us on an idle machine, but on a
# busy one a helper thread may wait milliseconds for a core, and the
# caller waits for its block: only products long enough to absorb that
# are split.
FLOPS_PER_THREAD = 32_000_000
# A 2-d product that splits (FLOPS_PER_THREAD) runs on OpenBLAS' own
# threads (blas_matmul_plan) where this process may use BLAS_MIN_CAP
# threads or more, BLAS_FLOPS_PER_THREAD operations each: about 60 us of
# one core's sgemm (~130 GFLOP/s with AVX-512). Its threads are C threads
# that wait spinning for a while after each call, so a hand-off costs
# microseconds, where our pool's helpers take turns on the GIL and each
# block repacks the operand the blocks share. Measured on a 16-core Xeon
# (issue 16, benchmarks/README.md, one run each, noisy): the MLP's
# 128x512 @ 512x512 product 0.50 ms on one thread, 0.39 on 4 of our
# pool's (its best), 0.135 on 16 of OpenBLAS'; fit of the MLP 24-25k
# samples/s on our pool, 31-34k on OpenBLAS' threads. Below 4 threads a
# helper or two hardly queue on the GIL, and spinning threads would take
# the cores of a small machine from other work: our pool, as before.
# Products that do not split (under 2 x FLOPS_PER_THREAD) stay on one
# thread either way: run beside other kernels (concurrent_steps.py) they
# do better (Keras' demo_functional at batch 32, its 17 MFLOP products on
# 2 of OpenBLAS' threads: 2.4-3.1k samples/s in four runs; on one thread
# 4.0-4.4k in two).
# The price: OpenBLAS' idle threads spin (yielding their core to any other
# runnable thread) for about 0.1 s after each call, so the MLP's CPU time
# per step grew from 7 to 50 ms there; `OPENBLAS_THREAD_TIMEOUT=4` set
# before the program starts makes them sleep at once (18 ms, same speed,
# one run). A busy machine (backing_off) runs the product on one thread.
BLAS_FLOPS_PER_THREAD = 8_000_000
BLAS_MIN_CAP = 4
# Floating-point operations per thread of a product on the C pool
# (product_pool.py): about 85 us of one core's sgemm here. Its hand-off
# costs no interpreter lock, only a helper's wake-up: measured on this
# 2-core VM (benchmarks/README.md, issue 16 seventh pass, load 5, CPU and
# minimum wall per call), Keras' demo_functional 32x512 @ 512x512 (17
# MFLOP) split over 2 threads: 0.128 -> 0.077 ms, process CPU 0.159 ->
# 0.198 ms; 8 MFLOP products (32x256 @ 256x512, 64x256 @ 256x256) gained
# nothing (0.064 -> 0.072 ms). So a product splits from 2 x 8 MFLOP.
NATIVE_FLOPS_PER_THREAD = 8_000_000
# The same for a product the C pool can split only in rectangles
# (product_pool.blocks' axis 2: a row tail kept whole, which packs the
# whole weight once more: +10% CPU for demo_functional's 32x512 @
# 512x512). Measured on the 2-core AMD VM (benchmarks/README.md, issue 16
# tenth pass, s10pool; the session's autogroup at nice -15 beside load
# 10): demo_functional (batch 32, Adam) split its 17 MFLOP products so
# and made 2,790-2,836 samples/s against 3,127-3,514 with them whole;
# the MLP's 67-103 MFLOP rectangles ran 1.52-1.65x faster (minimum wall).
RECTANGLE_FLOPS_PER_THREAD = 24_000_000
# Wide splits: on a host of many cores the C pool's blocks pay down to far
# less work than the constants above, which were measured on a 2-core VM
# (a sleeping helper there takes 22-52 us to claim its block at idle:
# issue 16, fifteenth pass). On the 16-core Xeon (issue 16, sixteenth
# pass, device run 1, default threads) the helper claimed its block 1-2
# us after a split was published, with 8-125 us since the step's previous
# split; demo_functional's 17 MFLOP products still split in two there
# (NATIVE_FLOPS_PER_THREAD), at 206-217 us per split against 256-324 us on
# one thread, while OpenBLAS' own threads ran the same 32x512 @ 512x512 in
# 0.208 / 0.107 / 0.079 / 0.063 ms on 1 / 4 / 8 / 16 threads, and our CPU
# per step was below JAX's at 1.7-1.9 cores against its 4.7-5.0. So where
# this process may use WIDE_MIN_THREADS threads or more (wide_splits), a
# 2-d product on the C pool splits in blocks of WIDE_FLOPS_PER_THREAD, up
# to WIDE_MAX_THREADS of them (more only where NATIVE_FLOPS_PER_THREAD
# gives more): a 32x512 @ 512x512 product in 8 column blocks of 64 (each
# above OpenBLAS' SMALL_MATRIX_MNK, the bound that keeps NumPy's bits on
# SkylakeX), its weight gradient 512x32 @ 32x512 in 8 row blocks; and a C
# chain in blocks of WIDE_ELEMENTS_PER_THREAD (Adam's update of a 512x512
# weight on 8 threads: 0.192 ms minimum there against 0.336 on 4 and 0.873
# on one). A wide plan of two blocks or fewer, or of rectangles, leaves
# the product to the rules above (their two-thread choices were
# measured). Blocks are claimed one at a time, so helpers that wake late
# leave theirs to the caller, which then runs them back to back (no slower
# than the whole product, but for repacking the shared operand per block);
# a busy machine's late splits start the back-off as before. On fewer than
# WIDE_MIN_THREADS threads (this project's 2-core VM, any `--threads 2`
# run) nothing changes (host_kind says why 4).
# `KERAS_IPU_WIDE_SPLITS=0` turns wide splits off (benchmarks' A/B).
WIDE_MIN_THREADS = 4
WIDE_FLOPS_PER_THREAD = 2_000_000
WIDE_MAX_THREADS = 8
WIDE_ELEMENTS_PER_THREAD = 1 << 15
# Elements per thread below which a fused elementwise chain stays on one
# thread (about 0.3 ms of a few-op chain; memory-bound, so far fewer
# operations per thread than a product's).
ELEMENTS_PER_THREAD = 1 << 18
# The same for a C chain or row sum on the C pool (chain_threads,
# sum_threads): its hand-off is a helper's wake-up, no interpreter lock,
# as for a product (NATIVE_FLOPS_PER_THREAD: about 85 us of work per
# thread). A chain costs 0.4-2 ns per element here (Keras' Adam update of
# a 512x512 weight: 0.49 ms minimum on one thread, 1.9 ns per element);
# measured on this 2-core VM (benchmarks/README.md, issue 16 eighth pass,
# load 7, minimum wall of 400 calls, one thread / two): Adam's chain over
# 262k elements 0.485 / 0.242-0.249 ms, over 131k 0.239 / 0.144, over 65k
# 0.043 / 0.048 (no gain), over 16k 0.023 / 0.026. So a chain splits from
# 64k elements per thread (about 85-120 us of Adam's chain).
NATIVE_ELEMENTS_PER_THREAD = 1 << 16
# A chain calling NumPy's transcendental loops (exp, tanh, the logistic
# function: numpy_loops.py) costs far more per element than the few
# cycles of Adam's the element rule was measured on: float32 exp 1.8 ns
# and tanh 4.0 ns per element on this 2-core AVX2 host (thread CPU of 16k
# elements, load 6), against 0.15 ns for an add or a multiply. Such a
# chain also splits once its loops' time reaches NATIVE_NS_PER_THREAD per
# thread: the hand-off threshold of a product (NATIVE_FLOPS_PER_THREAD,
# about 85 us of work). An LSTM cell's forward chain (3 logistic, 2 tanh
# on 128x128: 0.20 ms, minimum of 300 calls) splits in two; its backward
# chain (23 multiplies and adds, 0.056 ms) stays on one thread.
LOOP_NS_PER_ELEMENT = 2.5
NATIVE_NS_PER_THREAD = 85_000
# Blocks per thread: more than one, so threads that run late (a busy
# machine) leave their share to the others.
BLOCKS_PER_THREAD = 2
# But a 2-d product on the C pool splits in one block per thread: each
# block is one sgemm call that packs the operand the blocks share again
# and runs its edge kernels, and with a single cut a 12-row-aligned row
# split also replaces the three rectangles a row tail needs (the tail's
# block packs the whole weight once more). Measured on the 2-core AMD
# VM (benchmarks/README.md, issue 16 twelfth pass, s12mlp; minimum wall
# of 400 calls on 2 threads, one thread's in brackets): the MLP's 128x784
# @ 784x512 0.653 ms in three rectangles, 0.676 in four row blocks, 0.629
# in two (1.108); 128x512 @ 512x512 0.448 / 0.460 / 0.418 (0.733); its
# weight gradients 784x128 @ 128x512 0.608 in four row blocks, 0.793 in
# three, 0.571 in two (1.105). A late thread still leaves nothing
# unclaimed to wait for (the caller takes a block no helper has started),
# and one that loses its core inside its block makes the split late
# (note_pool_split), so the back-off covers a busy machine as before.
PRODUCT_BLOCKS_PER_THREAD = 1

# Streaming kernels (a copy, a pad, a broadcast add: one read and one write
# per element) split only where a second thread adds memory bandwidth:
# on this project's 2-core VM one thread already saturates it (a 64 MiB
# copy: 8.2 GB/s on one thread, 6.4 on two), so splitting them only adds
# hand-offs; a many-core server's cores each add bandwidth. Measured once
# per process (streaming_scales) with a copy of _PROBE_ELEMENTS floats,
# larger than the caches; two threads must be STREAMING_GAIN times as
# fast as one, so that the gain outlasts the pool's hand-offs and noise.
_PROBE_ELEMENTS = 1 << 22
STREAMING_GAIN = 1.3
_streaming_scales = None

_cap = None
_configured = False
_lock = threading.Lock()
# A cap for what one thread lowers (capped): a program that one thread of
# a split runs as a whole (a scan's row block: compiler/scan_rows.py).
_local = threading.local()


def user_cap(environ=os.environ):
    """The smallest of the CAP_VARIABLES set in `environ` (None: none is
    set). TensorFlow's pools follow it too (compiler/tensorflow_runtime.py)."""
    values = []
    for name in CAP_VARIABLES:
        value = environ.get(name, "").strip()
        if value:
            try:
                values.append(max(1, int(value)))
            except ValueError:
                raise ValueError(
                    f"{name}={value!r} is not a number of threads: set it to a "
                    "positive integer (1 runs every kernel on one thread)."
                ) from None
    return min(values) if values else None


def max_threads():
    """The most threads one kernel may use (see the module doc; within
    `capped`, its cap)."""
    local = getattr(_local, "cap", None)
    if local is not None:
        return local
    global _cap
    if _cap is None:
        cap = user_cap()
        if cap is None:
            try:
                cap = len(os.sched_getaffinity(0))
            except (AttributeError, OSError):
                cap = os.cpu_count() or 1
        _cap = max(1, cap)
    return _cap


@contextlib.contextmanager
def capped(n):
    """max_threads() is at most `n` in this thread meanwhile (None: no
    cap): kernels lowered within split over no more threads."""
    before = getattr(_local, "cap", None)
    if n is not None:
        # max_threads() is this thread's cap when one is set: a nested cap
        # never raises an outer one.
        _local.cap = min(int(n), max_threads())
    try:
        yield
    finally:
        _local.cap = before


def configure():
    """Once per process, when the first program is lowered: OpenBLAS on
    one thread (threadpoolctl finds every BLAS loaded; see the module
    doc for why a BLAS variable does not change this)."""
    global _configured
    if _configured:
        return
    with _lock:
        if _configured:
            return
        _configured = True
        try:
            from threadpoolctl import threadpool_limits
        except ImportError:
            return
        threadpool_limits(limits=1, user_api="blas")


def threads_for(flops):
    """Threads of our pool worth using for a kernel of `flops` operations;
    more than one: the kernel is split (a product may go to OpenBLAS'
    threads instead: matmul_plan)."""
    cap = max_threads()
    if cap == 1:
        return 1
    return int(max(1, min(cap, flops // FLOPS_PER_THREAD)))


def product_pool_takes(b, compute):
    """Whether a product of `b` batches (0: a 2-d product) computed in
    `compute` splits on the C pool (product_pool.py) where it splits:
    float32 or float64 (where its check passed), 2-d or batched."""
    if (np.dtype(compute) not in FLOAT_DTYPES
            or not env_switch("KERAS_IPU_PRODUCT_POOL")):
        return False
    configure()  # OpenBLAS on one thread before the pool's first check and blocks
    return product_pool.available(compute)


# -- the host: two threads, or many ------------------------------------------
# The rules that depend on the machine rather than on one kernel's size know
# the host by the threads this process may use (max_threads: a cap, else its
# cores) alone, not by a probe of the pool's hand-off: a sleeping helper's
# delay measured on this 2-core VM (two row blocks of ~6 MFLOP, each split
# after 0.1-0.2 ms idle) read 28-58 us at load 4.4 (26 of 40 splits with a
# helper in time), but 4.5-9.0 us (10th-90th percentile, 51-54 of 100
# splits) at load 7.4, where the woken helper preempts another process on
# the other core: it measures how fast a thread is scheduled, not whether a
# core is free, and a busy moment read early. Three kinds (host_kind):
# - TWO_THREADS, up to TWO_THREAD_HOST (2) threads: this project's 2-core
#   VM, or a `--threads 2` run anywhere. The pool has one helper, and that
#   helper not taking a launched C-pool job by its join, or a scan's block
#   split running late, is how a busy machine shows there: both start the
#   shared back-off (_on_two_threads: _join_on_c_pool, note_blocks), the
#   rules measured under load on that VM (issue 16, eleventh to fifteenth
#   passes). From 3 threads one of two or more helpers waking late (a VM's
#   idle vCPU) or blocks taking turns on the GIL say nothing of the
#   machine, and the back-off ran every split on the caller with the other
#   helpers idle (16-core Xeon at default threads, issue 16 sixteenth
#   pass).
# - WIDE, from WIDE_MIN_THREADS (4) threads: the C pool's products and
#   chains also split in wide blocks (wide_splits; what was measured: the
#   comment above WIDE_MIN_THREADS). A wide plan changes anything only
#   where it makes more than two blocks (else the two-thread rules keep
#   the product), and what set its sizes was measured at 4 to 16 threads
#   on the 16-core Xeon (OpenBLAS' threads on 32x512 @ 512x512 at 4, 8 and
#   16, Adam's chain at 4 and 8); 3 threads, measured nowhere, keep the
#   sizes measured at two.
# - FEW_THREADS, 3 threads: the two-thread sizes, the many-thread back-off.
# Whether one split ran late is judged per split (split_late: by its own
# helpers, whatever the host), not here.
TWO_THREAD_HOST = 2
TWO_THREADS, FEW_THREADS, WIDE = "two threads", "few threads", "wide"


def host_kind(cap=None):
    """TWO_THREADS, FEW_THREADS or WIDE (see above) for this process's
    max_threads(); `cap` stands for it (tests)."""
    cap = max_threads() if cap is None else cap
    if cap <= TWO_THREAD_HOST:
        return TWO_THREADS
    return WIDE if cap >= WIDE_MIN_THREADS else FEW_THREADS


def wide_splits(cap=None):
    """Whether the C pool's kernels split in wide blocks here (see
    WIDE_MIN_THREADS): a WIDE host (host_kind), unless
    `KERAS_IPU_WIDE_SPLITS` is 0. `cap` stands for this process's
    (max_threads; tests)."""
    return host_kind(cap) == WIDE and env_switch("KERAS_IPU_WIDE_SPLITS")


def wide_threads(flops, cap):
    """Threads a 2-d product of `flops` operations splits over in wide
    splits (wide_splits): one per WIDE_FLOPS_PER_THREAD, up to
    WIDE_MAX_THREADS, or NATIVE_FLOPS_PER_THREAD's count where it is more;
    at most `cap`."""
    share = max(flops // NATIVE_FLOPS_PER_THREAD,
                min(WIDE_MAX_THREADS, flops // WIDE_FLOPS_PER_THREAD))
    return int(min(cap, share))


def _wide_product_split(m, n, k, compute):
    """(threads, (axis, edges)) of a 2-d product in wide splits: row or
    column blocks (product_pool.blocks, which keep its bits here) of
    wide_threads, one per thread; None where they are two or fewer, or
    rectangles (the rules for the two-thread split decide then)."""
    threads = wide_threads(2 * m * n * k, max_threads())
    if threads <= 2:
        return None
    planned = product_pool.blocks(m, n, k, threads, PRODUCT_BLOCKS_PER_THREAD, compute)
    if planned is None or planned[0] == 2 or product_pool.block_count(*planned) <= 2:
        return None
    return threads, planned


def _native_product_split(b, m, n, k, compute, threads=None):
    """(threads, blocks) of a product on the C pool: blocks are
    (axis, edges) of a 2-d product (product_pool.blocks) or the batch
    edges of a batched one; None when it stays on one thread. `threads`
    overrides the policy's count (benchmarks). A 2-d product on a host of
    wide splits (wide_splits) splits wide where it can."""
    if threads is None:
        if not b and wide_splits():
            wide = _wide_product_split(m, n, k, compute)
            if wide is not None:
                return wide
        threads = int(min(max_threads(), 2 * max(b, 1) * m * n * k // NATIVE_FLOPS_PER_THREAD))
        if threads <= 1:
            return None
    if b:
        edges = product_pool.batch_blocks(b, threads, BLOCKS_PER_THREAD)
        return None if edges is None else (threads, (0, edges))
    planned = product_pool.blocks(m, n, k, threads, PRODUCT_BLOCKS_PER_THREAD, compute)
    if (planned is not None and planned[0] == 2
            and 2 * m * n * k < threads * RECTANGLE_FLOPS_PER_THREAD):
        # Rectangles not worth it: row (or column) blocks where they fit.
        # Only from three threads (on two, rectangles are planned only where
        # no two row blocks fit); without this the MLP's 67-103 MFLOP
        # products ran on one thread at 8-16 threads on AMD's rule.
        planned = product_pool.blocks(m, n, k, threads, PRODUCT_BLOCKS_PER_THREAD, compute,
                                      rectangles=False)
    if planned is None:
        tail = row_tail_split(m, n, k, compute, threads)
        return None if tail is None else (2, (0, tail))
    return threads, planned


def row_tail_split(m, n, k, compute, threads=None):
    """The edges of a 2-d product split in its aligned rows and its row
    tail on two threads (product_pool.row_tail), or None: from 2 x
    NATIVE_FLOPS_PER_THREAD, where neither two row blocks nor rectangles
    worth it (RECTANGLE_FLOPS_PER_THREAD) fit. Each block packs the whole
    of y, so the tail's block costs most of the top's (one thread's CPU
    time of x @ a 512x512 y here: 8 rows 111 us, 24 rows 175, 32 rows
    216), but the caller claims the top first and a helper that wakes
    late still ends first. Measured on the 2-core AMD VM (issue 16,
    thirteenth pass, s13demo; autogroup -15, load 3), demo_functional's
    32x512 @ 512x512: minimum / median wall of 300 calls 223 / 284 us on
    one thread, 174 / 234 in 24 + 8 rows, 187 / 261 in rectangles, 206 /
    305 in 12 + 20 rows (the helper, waking late, takes the longer)."""
    if threads is None:
        threads = int(min(max_threads(), 2 * m * n * k // NATIVE_FLOPS_PER_THREAD))
    if threads != 2 or 2 * m * n * k >= 2 * RECTANGLE_FLOPS_PER_THREAD:
        return None
    return product_pool.row_tail(m, n, k, compute)


def product_threads(b, m, n, k, compute):
    """Threads the policy splits a product over (1: one thread): x (b, m,
    k) @ y (b, k, n) (b = 0: 2-d) of dtype `compute`, as matmul_plan does.
    A product OpenBLAS' threads run counts its OpenBLAS threads."""
    flops = 2 * max(b, 1) * m * n * k
    cap = max_threads()
    if cap == 1 or np.dtype(compute) not in FLOAT_DTYPES:
        return 1
    if product_pool_takes(b, compute):
        split = _native_product_split(b, m, n, k, compute)
        return 1 if split is None else split[0]
    return max(threads_for(flops), 0 if b else blas_threads_for(flops))


def blas_threads_for(flops):
    """Threads of OpenBLAS for a 2-d product of `flops` operations that
    splits (threads_for > 1) on a host of at least BLAS_MIN_CAP threads;
    0 where our pool splits it (fewer threads, or OpenBLAS' count cannot
    be set)."""
    cap = max_threads()
    if cap < BLAS_MIN_CAP or threads_for(flops) <= 1 or not blas_thread_setters():
        return 0
    return int(min(cap, max(2, flops // BLAS_FLOPS_PER_THREAD)))


def threads_for_elements(n):
    """Threads worth using for a memory-bound kernel over `n` elements
    (a fused chain, a pad, a sum: leading_axis.py)."""
    cap = max_threads()
    if cap == 1:
        return 1
    return int(max(1, min(cap, n // ELEMENTS_PER_THREAD)))


def chain_threads(n, loop_calls=0, wide=False):
    """Threads a C fused chain of `n` elements, `loop_calls` of its steps
    NumPy's transcendental loops, splits over (1: one thread): on the C
    pool from NATIVE_ELEMENTS_PER_THREAD elements or NATIVE_NS_PER_THREAD
    of its loops' time per thread, else on the Python pool as
    threads_for_elements says. `wide` (a fused chain's own split, not the
    kernels sized like one): on a host of wide splits (wide_splits), from
    WIDE_ELEMENTS_PER_THREAD elements per thread, up to WIDE_MAX_THREADS
    threads, where that makes more than two."""
    if not product_pool.tasks_available():
        return threads_for_elements(n)
    cap = max_threads()
    if cap == 1:
        return 1
    share = n // NATIVE_ELEMENTS_PER_THREAD
    if loop_calls:
        share = max(share, int(n * loop_calls * LOOP_NS_PER_ELEMENT) // NATIVE_NS_PER_THREAD)
    if wide and host_kind(cap) == WIDE:
        wider = min(WIDE_MAX_THREADS, n // WIDE_ELEMENTS_PER_THREAD)
        if wider > max(share, 2) and wide_splits():
            share = wider
    return int(max(1, min(cap, share)))


# Columns per task of a row sum on the C pool, at least: each task reads
# its columns of every row, so narrower tasks would share cache lines (16
# floats each) of every row between threads and read each line twice.
SUM_TASK_COLUMNS = 64


def sum_column_threads(rows, cols):
    """The threads sum_split's column blocks would take where bandwidth
    scales, whatever streaming_scales says (1: none): a sum they can take
    keeps NumPy's bits on any host, never row blocks' (leading_sums.py)."""
    if not product_pool.tasks_available():
        return 1
    return max(1, min(chain_threads(rows * cols), cols // SUM_TASK_COLUMNS))


def sum_split(rows, cols):
    """(threads, columns per task) of a float32 sum of `rows` rows of
    `cols` columns (native/leading_sums.py) on the C pool, in column blocks
    (each column still adds its rows in order: NumPy's bits); (1, cols)
    where it stays on one thread (leading_axis.split_sum may still split
    its rows over the Python pool). The C sum reads each element once at
    memory speed: a streaming kernel, split only where a second thread
    adds bandwidth (streaming_scales; on this project's 2-core VM a
    4096x512 sum took 0.286 ms on one thread and 0.391 in four column
    blocks on two, minima at load 10)."""
    threads = sum_column_threads(rows, cols)
    if threads <= 1 or not streaming_scales():
        return 1, cols
    width = -(-cols // (threads * BLOCKS_PER_THREAD))
    width = max(SUM_TASK_COLUMNS, -(-width // 16) * 16)  # whole cache lines
    return threads, width


def streaming_scales():
    """Whether memory bandwidth grows with a second thread here (see
    STREAMING_GAIN); measured once, in about 20 ms."""
    global _streaming_scales
    if _streaming_scales is None:
        import time

        src = np.ones(_PROBE_ELEMENTS, np.float32)
        dst = np.empty_like(src)
        half = _PROBE_ELEMENTS // 2

        def split_copy():
            parallel_for(lambda i: np.copyto(dst[i * half:(i + 1) * half],
                                             src[i * half:(i + 1) * half]), 2, 2)

        best = {}
        for name, fn in (("one", lambda: np.copyto(dst, src)), ("two", split_copy)) * 4:
            start = time.perf_counter()
            fn()
            best[name] = min(best.get(name, 1e9), time.perf_counter() - start)
        _streaming_scales = best["one"] >= STREAMING_GAIN * best["two"]
    return _streaming_scales


def ranges(n, block, threads):
    """[lo, hi) element ranges of about equal size, lo a multiple of
    `block`, for `threads` threads (BLOCKS_PER_THREAD each); one range when
    the work is not worth splitting."""
    if threads <= 1:
        return ((0, n),)
    count = threads * BLOCKS_PER_THREAD
    step = -(-n // count)
    step = -(-step // block) * block
    return tuple((lo, min(lo + step, n)) for lo in range(0, n, step))


def background_priority():
    """The calling thread at the lowest priority (nice 19; on Linux nice
    is per thread), for work that should only take CPU nobody else wants:
    the auto engine's background XLA compile (compiler/tiered_runner.py).
    Threads it starts inherit it. Nothing happens where the OS refuses."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
    except (AttributeError, OSError):
        pass


# -- the pool ------------------------------------------------------------


class _Job:
    __slots__ = ("fn", "count", "next", "left", "lock", "done", "error", "result",
                 "launched_at", "caller_cpu", "cpu", "at_once")

    def __init__(self, fn, count):
        self.fn = fn
        self.count = count
        self.next = 0
        self.left = count
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.error = None
        self.result = None
        self.launched_at = 0.0
        self.caller_cpu = 0.0
        self.cpu = 0.0
        self.at_once = True

    def work(self):
        """Take blocks until none is left; returns how many this thread ran."""
        ran = 0
        while True:
            with self.lock:
                i = self.next
                if i >= self.count:
                    return ran
                self.next = i + 1
            ran += 1
            try:
                self.fn(i)
            except BaseException as error:  # noqa: BLE001 - re-raised by run
                self.error = error
            with self.lock:
                self.left -= 1
                if self.left == 0:
                    self.done.set()


_queue = queue.SimpleQueue()
_workers = []


def _worker():
    while True:
        job = _queue.get()
        job.work()


def _ensure_workers(n):
    with _lock:
        while len(_workers) < n:
            t = threading.Thread(target=_worker, daemon=True,
                                 name=f"keras_ipu host kernel {len(_workers)}")
            t.start()
            _workers.append(t)


# -- backing off while the helpers get no core ---------------------------
# A split pays only if the helper threads get a core while the caller
# works. When they do not (other processes hold the cores), the caller
# runs every block itself or waits for a helper descheduled in the middle
# of its block, and the hand-off is pure cost: in issue 16, on 2 cores
# beside other work, every split product of the benchmark models was
# slower on two threads than on one (benchmarks/README.md). So each split
# notes whether its helpers were late: they ran no block, or the caller
# waited for them longer than running their blocks itself would have
# taken (split_late; the C pool's splits: only the wait,
# note_pool_split). After LATE_SPLITS late
# splits in a row, splits run on the caller alone (the same blocks in
# order: the same values) for a back-off that starts at BACKOFF_SECONDS
# and doubles while the probe after it is late again, up to
# MAX_BACKOFF_SECONDS; a probe that is not late ends it. One late split
# is noise (a page fault, a timer); three in a row are a busy machine.
LATE_SPLITS = 3
BACKOFF_SECONDS = 0.1
MAX_BACKOFF_SECONDS = 3.2
_late = 0
_backoff = 0.0
_resume_at = 0.0


def _note_split(late, now, at_once=False):
    """`at_once`: this late split alone starts the back-off (a late join:
    see LATE_WAIT_SECONDS)."""
    global _late, _backoff, _resume_at
    if not late:
        _late, _backoff = 0, 0.0
        return
    _late += 1
    if _backoff or _late >= LATE_SPLITS or at_once:  # a late probe, or the third in a row
        _backoff = min(2 * _backoff, MAX_BACKOFF_SECONDS) if _backoff else BACKOFF_SECONDS
        _resume_at = now + _backoff


def backing_off():
    """Whether splits run on the caller alone now (see LATE_SPLITS)."""
    return _backoff > 0.0 and time.perf_counter() < _resume_at


def parallel_for(fn, count, threads):
    """fn(0) .. fn(count - 1) on up to `threads` threads (the caller is
    one); blocks are claimed one at a time. Returns when all are done.
    While backing off (a busy machine) the caller runs every block."""
    if threads <= 1 or count <= 1 or backing_off():
        for i in range(count):
            fn(i)
        return
    helpers = min(threads, count) - 1
    _ensure_workers(helpers)
    job = _Job(fn, count)
    start = time.perf_counter()
    for _ in range(helpers):
        _queue.put(job)
    ran = job.work()
    own = time.perf_counter()
    job.done.wait()
    end = time.perf_counter()
    # A caller that ran every block had no helper come (here a Python
    # thread that needs the GIL and a core): late, unlike the C pool's.
    _note_split(ran == count or split_late(ran, count, own - start, end - own, threads),
                end)
    _result(job)  # a block's exception raised here, as join raises a job's


# -- one kernel beside the caller -----------------------------------------

# A launched kernel taken by a pool thread holds up its join by at most its
# own CPU time when that thread keeps its core (less, since the caller
# worked meanwhile), plus a wake-up (tens of microseconds on an idle
# machine). A join that waits longer than the kernel's CPU time plus
# LATE_WAIT_SECONDS saw the pool thread lose its core mid-kernel; a caller
# whose wall time from the launch to the join exceeds twice its CPU time
# plus LATE_WAIT_SECONDS lost its own core meanwhile (a busy machine's time
# slices are milliseconds; a second thread of ours then competes with the
# caller for the cores and for the GIL, which a descheduled thread may
# hold). Either is a late split, and the back-off starts at once, not
# after LATE_SPLITS: such a wait (a time slice) costs more than a launch
# can gain (one kernel's time), and a step's many joins on time would
# otherwise keep resetting the count between the late ones.
LATE_WAIT_SECONDS = 0.0005


def launch(fn, args):
    """Start fn(*args) on a pool thread while the caller goes on; `join`
    gives its result. The caller runs it at `join` if no pool thread has
    taken it by then, so a busy machine costs the hand-off only. While
    backing off (see LATE_SPLITS) it runs now, in the caller. A job that
    stands in for a split (`fn.stands_for_a_split`: concurrent_steps.
    splits_in_two) backs off as the split does: after LATE_SPLITS late
    joins in a row, not at its first (LATE_WAIT_SECONDS)."""
    if backing_off():
        return _Ran(fn(*args))
    return _start(fn, args, not getattr(fn, "stands_for_a_split", False))


def _start(fn, args, at_once):
    """fn(*args) queued for a pool thread: a job to join."""
    job = _Job(None, 1)
    job.at_once = at_once

    def call(_):
        cpu = time.thread_time()
        job.result = fn(*args)
        job.cpu = time.thread_time() - cpu

    job.fn = call
    _ensure_workers(max_threads() - 1)
    job.launched_at, job.caller_cpu = time.perf_counter(), time.thread_time()
    _queue.put(job)
    return job


def launch_on_c_pool(start, fn, args):
    """Start fn(*args) as `start(*args)` does it on the C pool: a job of C
    kernels with no Python and no GIL in it, which a helper thread runs
    while the caller goes on (a weight gradient and its update:
    _elementwise.launch_pair, concurrent_steps._c_pool_start). `start`
    returns (handle, finish): `join` calls finish(handle) for the result,
    after which the job's buffers are released, or None where the C kernels
    cannot take the operands: then fn(*args) is launched as `launch` does.
    While backing off it runs now, in the caller (fn, the same bits)."""
    if backing_off():
        return _Ran(fn(*args))
    started = start(*args)
    if started is None:
        return launch(fn, args)
    return _OnCPool(started, not getattr(fn, "stands_for_a_split", False), time.perf_counter())


# join_pair's caller_ran where the caller ran a job the helpers, busy with
# its earlier launched jobs, had not reached (_task_pool.h).
C_POOL_CALLER_RAN_BEHIND = 2


class _OnCPool:
    """A job launched on the C pool (launch_on_c_pool) at `launched_at`
    (perf_counter seconds; the default: long before its join)."""

    __slots__ = ("started", "at_once", "launched_at")

    def __init__(self, started, at_once, launched_at=float("-inf")):
        self.started = started
        self.at_once = at_once
        self.launched_at = launched_at


# A launched job the caller ran at its join cost the caller what running
# it without a launch would have, and the hand-off: judged as a split is
# (split_late: did it end later than the caller alone would have?), it is
# not late, as a C pool split the caller ran whole is no note. On two
# threads it stays late: there the pool's one helper not taking it by the
# join is how a busy machine shows (issue 16, fourteenth and fifteenth
# passes measured the back-off under load with it), and the decisions
# measured there stand. On more threads one sleeping helper's slow wake
# (a VM's idle vCPU: tens of microseconds to milliseconds) said nothing of
# the machine, and the back-off it started at once (at_once) ran every
# split of the next 0.1 s on the caller alone with the other helpers idle
# (16-core Xeon, default threads, the lead's device run 2, split_late in
# force: the CNN noted 0.1 late splits per step and its caller ran 0.07
# C-pool jobs per step at the join, each late where joined 0.5 ms or more
# after its launch; the CNN with no back-off at all 1,550 samples/s
# against 1,392, one run each). A helper that took the
# job and lost its core (the join waited past the job's CPU time) is late
# on any host: the caller waited longer than the job would have taken it.
def _on_two_threads():
    """Whether this host's back-off decisions are the two-thread ones
    measured under load on the project's 2-core VM (host_kind, see above,
    and note_blocks): a launched C-pool job no helper took by its join is
    late there, and a late scan block split starts the shared back-off."""
    return host_kind() == TWO_THREADS


def _join_on_c_pool(job):
    """The C pool's job's result. Late (LATE_SPLITS, the job's `at_once`)
    where no helper had taken it by the join (the caller ran it: no helper
    got a core meanwhile) or the caller waited longer than the job's own
    CPU time (its helper lost its core mid-job). A run loop that lost its
    own core does not delay a job without the GIL: not late. A job the
    caller ran while the helpers were still on its earlier launched jobs
    (caller_ran 2: a backward launches more pairs than one helper gets
    through, and the end of a step joins the last launched first) says
    nothing about the machine and notes nothing: counted late, it started
    the back-off in nearly every step of demo_functional at two threads on
    an idle machine, and its pairs ran in the caller (issue 16, fourteenth
    pass, s14demo). Those earlier jobs' own joins still see a helper that
    lost its core. A job the caller ran where no helper could have taken
    it yet (joined within LATE_WAIT_SECONDS of its launch: a helper asleep
    since its last job wakes in tens of microseconds to a millisecond on a
    VM) cost only the hand-off and notes nothing either: counted late, the
    benchmark CNN's launched product (its Dense layer's input gradient,
    joined by the next step) started the back-off 0.6-0.8 times per step
    on an idle machine, and 11-15 of its 17 convolution and pooling
    splits per step ran on the caller alone (issue 16, fifteenth pass,
    s15cnn). On a host of more than two threads a job the caller ran notes
    nothing at all (_on_two_threads)."""
    handle, finish = job.started
    joined_at = time.perf_counter()
    result, (caller_ran, wait, cpu) = finish(handle)
    if caller_ran == C_POOL_CALLER_RAN_BEHIND or (caller_ran and (
            joined_at - job.launched_at <= LATE_WAIT_SECONDS or not _on_two_threads())):
        return result
    _note_split(caller_ran or wait > cpu + LATE_WAIT_SECONDS, time.perf_counter(),
                job.at_once)
    return result


def join(job):
    """The result of a launched call (its exception raised here), once
    it is done; the caller runs it itself if no pool thread took it. A
    pool thread or a caller that lost its core since the launch makes it
    a late split (LATE_WAIT_SECONDS)."""
    if type(job) is _Ran:
        return job.result
    if type(job) is _OnCPool:
        return _join_on_c_pool(job)
    start = time.perf_counter()
    late = (start - job.launched_at
            > 2 * (time.thread_time() - job.caller_cpu) + LATE_WAIT_SECONDS)
    if not job.work():  # a pool thread took it
        job.done.wait()
        end = time.perf_counter()
        _note_split(late or end - start > job.cpu + LATE_WAIT_SECONDS, end, job.at_once)
    elif late:
        _note_split(True, start, job.at_once)
    return _result(job)


def _result(job):
    """A finished job's result; its exception raised here."""
    if job.error is not None:
        raise job.error
    return job.result


class _Ran:
    """A launched call run at once (while backing off): no job, no hand-off."""

    __slots__ = ("result",)

    def __init__(self, result):
        self.result = result


# -- products ------------------------------------------------------------

_MIN_BLOCK = product_pool.MIN_BLOCK


def _blocks(size, threads, min_block=_MIN_BLOCK):
    count = min(threads * BLOCKS_PER_THREAD, size // min_block)
    count = max(count, 1)
    edges = np.linspace(0, size, count + 1).astype(int)
    return tuple(zip(edges[:-1], edges[1:]))


def matmul_plan(b, m, n, k, compute, threads=None, native=None):
    """A function computing matmul(x, y, out=None) for x (b, m, k) (or (m, k)
    when b is 0) and y (b, k, n) (or (k, n)) of dtype `compute` on several
    threads: a 2-d product on OpenBLAS' own where blas_threads_for says so,
    else split into blocks over our pool (a batched one: numpy loops over
    its small products, which OpenBLAS' threads cannot share); None when
    one thread is right (small products, dtypes BLAS does not run).
    A product splits on the C pool where product_pool_takes it. `threads` overrides the policy's count and splits over our pool,
    `native` picks the C pool (True) or the Python pool (False)
    (benchmarks/host_threads.py measures each)."""
    if np.dtype(compute) not in FLOAT_DTYPES:
        return None
    configure()
    if native is None:
        native = product_pool_takes(b, compute)
    elif native:  # asked for (benchmarks): where the C pool can take it at all
        native = product_pool.available(compute)
    if native:
        split = _native_product_split(b, m, n, k, compute, threads)
        if split is None:
            return None
        threads, blocks = split
        even = None if b else even_rows(m, n, k, compute, blocks)
        return _native_split_plan((b, m, n) if b else (m, n), compute, threads, blocks,
                                  _python_split_plan(b, m, n, compute, threads), even)
    if threads is None:
        flops = 2 * max(b, 1) * m * n * k
        blas_threads = 0 if b else blas_threads_for(flops)
        if blas_threads:
            return blas_matmul_plan(blas_threads)
        threads = threads_for(flops)
    if threads <= 1:
        return None
    return _python_split_plan(b, m, n, compute, threads)


# A split of the C pool whose caller ran every task (no helper took one in
# time) cost the hand-off alone: the caller ran the blocks back to back, no
# slower than the whole kernel on one thread (the MLP's products, two row
# blocks on one thread against one np.matmul: 0.97-1.05x; issue 16,
# fourteenth pass, s14mlp). Counted late, as it was, it started the
# back-off on a machine where the splits paid: a helper asleep since the
# last split wakes late now and then (a VM's idle core wakes in tens of
# microseconds to milliseconds), three such splits in a row came every
# few dozen steps, and the probe after each back-off, whose helper had
# slept all through it, was late again as often: the MLP at two threads
# ran backed off 80-90% of the time and used one core (7.0 ms per step
# against 6.0 with no back-off at load 7). Only a caller that waited for
# its helpers longer than running their tasks itself would have taken (a
# helper that lost its core inside its block: split_late) makes a split
# late; a split no helper joined is no note at
# all, neither late nor on time.
def note_pool_split(done, count, threads=None):
    """Notes a split the C pool ran (product_pool.run, the C chains and
    row sums: `done` = (tasks the caller ran, its own seconds, its wait
    for the helpers), `count` tasks on up to `threads` threads): late as
    split_late judges it (LATE_SPLITS); none when the caller ran every
    task itself."""
    global _punctual
    ran, own, wait = done
    _punctual += PUNCTUAL_WEIGHT * ((ran < count) - _punctual)
    if ran < count:
        _note_split(split_late(ran, count, own, wait, threads), time.perf_counter())


# Of two row blocks, product_pool's plan makes the caller's the larger
# (HELPER_LATE_FLOPS) for a helper that wakes late. On our own gemm
# (product_pool.native_gemm) a step's splits come twice as close together,
# and with free cores the helper, still spinning from the last one, starts
# 1 us after a split is published: the larger block only leaves it idle at
# the end. Measured on the 2-core AMD VM (issue 16, twenty-second pass,
# s22thr; benchmarks/split_timing.py, the fit's autogroup at nice -15):
# demo_functional's 512x32 @ 32x512 weight gradients cut at 393 of 512
# rows took 62 us per split, the helper's thread ending 40 us before the
# caller's; cut evenly 43 us, both ending together. Under load (no helper
# joined 45-65% of the splits) the larger block is what keeps the caller
# from waiting for a helper that came late: the even cut everywhere lost
# there (demo_functional 4 of 11 alternated pairs, the MLP's CPU per step
# higher in 8 of 9). So such a product cuts evenly only while a helper
# joined at least PUNCTUAL_SHARE of the recent C-pool splits (_punctual:
# an average over about 1 / PUNCTUAL_WEIGHT splits, note_pool_split; 91-99%
# with free cores, 35-55% under load), else as planned. Fit at `--threads
# 2`, alternated processes, against the planned cut always: with free
# cores the MLP 101,857 -> 109,167 samples/s (2.27 -> 2.18 CPU ms per
# step), faster in 7 of 7 pairs; demo_functional b32 Adam 11,610 ->
# 12,287 (4.86 -> 4.52), faster in 8 of 13 pairs, CPU lower in 10; the
# LSTM and the transformer level or faster; beside fit_throughput's busy
# process (`--load`) the planned cut ran 95-100% of the splits, the demo
# and the MLP level. Updated without a
# lock from any thread that splits: a lost update only delays the switch.
# PUNCTUAL_SHARE above 1 keeps the planned cut (benchmarks' A/B).
PUNCTUAL_WEIGHT = 1 / 16
PUNCTUAL_SHARE = 0.8
_punctual = 0.0


def helper_punctual():
    """Whether a helper joined at least PUNCTUAL_SHARE of the recent C-pool
    splits (see above)."""
    return _punctual >= PUNCTUAL_SHARE


def even_rows(m, n, k, compute, blocks):
    """The even edges of a product whose plan `blocks` is two row blocks,
    the caller's the larger (product_pool._caller_first), on our own gemm
    and a host of TWO_THREADS, where it was measured (see PUNCTUAL_SHARE);
    None for any other plan or host."""
    axis, edges = blocks
    if (axis != 0 or len(edges) != 3 or np.dtype(compute) != np.float32
            or host_kind() != TWO_THREADS or not product_pool.native_gemm()):
        return None
    even = product_pool.side_edges(m, n, k, 2, product_pool.rule(compute).rows)
    return None if even is None or np.array_equal(even, edges) else even


def split_kernel(kernel, threads, count, *split_args, whole=None, lead=0):
    """call(*args): the C kernel kernel(*args, threads, *split_args), which
    runs its `count` tasks on up to `threads` threads of the C pool
    (_task_pool.h) and returns a tuple of `lead` results of its own (a
    maximum's rows left to NumPy: _rows.c) and the split's stats, which are
    noted (note_pool_split); while backing off, whole(*args) (None:
    kernel(*args), the kernel on the caller's thread). Returns the kernel's
    result as it is: anything but a tuple (False, -1, a whole call's True)
    is noted as nothing, and the caller tells from it whether the buffers
    fit."""
    busy, note = backing_off, note_pool_split
    whole = kernel if whole is None else whole
    tail = (threads, *split_args)

    def call(*args):
        if busy():
            return whole(*args)
        done = kernel(*args, *tail)
        if type(done) is tuple:
            note(done[lead:] if lead else done, count, threads)
        return done

    return call


# A split is late where it ended later than the caller running every task
# alone would have: the caller ran `ran` of `count` tasks in `own` seconds,
# so the other count - ran would have taken it about own * (count - ran) /
# ran more, and the split lost where its wait for the helpers exceeded
# that. On many cores the old rule (the caller waited longer than it
# worked) called a split late whose caller ran 1 of 16 tasks and waited 2x
# its own time for 15 helpers (on time: alone it would have taken 15x):
# measured on a 16-core Xeon at default threads (issue 16, sixteenth pass,
# the lead's device run 2), the CNN ran 2 late splits per step, each
# starting the shared back-off, 748 samples/s (JAX 1,457); under this
# rule 1,392; the LSTM 1,705 -> 2,806 (JAX 2,708).
# The factor is at least 1 (never stricter than the old rule) and at most
# the split's helpers, threads - 1: a caller that ran fewer than its share
# of the tasks was itself slow (a busy machine took its core), so its time
# per task overstates the tasks' cost. On two threads the factor is
# therefore 1, the old rule, and the decisions measured there under load
# stand (the uncapped factor called 0.02-0.13 late splits per step of the
# CNN, LSTM, demo_functional and transformer on time at load 3, all with
# the caller on 1 of 4 tasks). A caller that ran no task (the helpers took
# them all before it claimed one) has no time per task: the old rule.
# The rule goes by this split's helpers, not by the host (host_kind): a
# split of two tasks on a 16-thread host has one helper, whose lateness
# reads as on two threads, and its factor is 1 there too.
def split_late(ran, count, own, wait, threads=None):
    """Whether a split of `count` tasks over `threads` threads (None: as
    many as tasks), `ran` of them run by the caller in `own` seconds after
    which it waited `wait` for the helpers, ended later than the caller
    alone would have (see above)."""
    helpers = min(count if threads is None else threads, count) - 1
    if ran <= 0 or helpers <= 1:
        return wait > own
    return wait > own * max(1.0, min(helpers, (count - ran) / ran))


# A split whose threads each run a long block (a scan's rows, milliseconds
# each: compiler/scan_rows.py) pays only if they ran at once: its wall
# time is then about one block's CPU time, half their sum on two threads.
# On a machine whose other processes leave this one a single core's share
# both threads make progress at half speed, so no join waits long and
# join's checks see nothing, while the split's extra work (each block
# packs the weights again, two threads take turns on the GIL) makes the
# step slower (issue 16, eleventh pass: +10% per fit step). Such a split
# is late when its wall time exceeds BLOCKS_LATE_SHARE of the CPU time its
# threads spent together (a gain below 1.18x). The split pays while its
# wall time is below the whole body's, about its threads' CPU time over
# 1.07-1.13 (the blocks' own extra work, their threads running at once
# adding none: the LSTM's forward and backward scans, issue 16,
# fourteenth pass), so 0.88-0.93 of that time; 0.85 keeps a margin for
# the noise. At 0.75 the LSTM's backward split (0.70 of its CPU time at
# best on this 2-core VM) was often judged late and its back-off ran the
# forward scan whole too: in-process, epochs alternating, 2 threads, load
# 10 (autogroup -15), 0.85 split 37 of 60 scans per epoch against 23 and
# ran 47.1 ms per step against 49.6 (58.6 against 61.9 in a second run);
# 0.9 split more (49) but ran no faster (49.8) for 15% more CPU.
#
# These splits keep a back-off of their own, which only their own
# measure starts: a late join or product split elsewhere in the step (one
# kernel's hand-off, tens of microseconds of work) says little about a
# split whose blocks run for milliseconds, and the shared back-off ran the
# LSTM's scans whole for most of a fit at two threads (issue 16,
# thirteenth pass: at load 6-8, 0 to 76 of 240 scans split under the
# shared back-off, half of them or more under their own). On two threads
# a late block split still starts the shared back-off too: the machine is
# busy. On more it starts the blocks' own only: there a split of 5-8
# blocks (the LSTM's 128 rows at 16 threads) also runs late where the
# blocks take turns on the GIL, each running the loop's Python for every
# time step (on this VM at 16 threads, five blocks spent 1.5x the whole
# body's CPU time, two 1.1x: issue 16, sixteenth pass, s16late), which
# says the split does not pay, not that the machine is busy; a busy
# machine's cores show in the kernels' own splits (split_late), and the
# shared back-off would have run them all on the caller with the other
# helpers idle.
BLOCKS_LATE_SHARE = 0.85
_blocks_backoff = 0.0
_blocks_resume_at = 0.0


def note_blocks(wall, cpu):
    """Notes a split whose threads each ran whole blocks: `wall` seconds
    from its launch to its last join, `cpu` seconds of its threads' CPU
    time together. A late one starts (or doubles, up to
    MAX_BACKOFF_SECONDS) the blocks' back-off and, on two threads, starts
    the shared one at once (as a late join); one on time ends the blocks'
    back-off and leaves the shared one to the kernels' own splits."""
    global _blocks_backoff, _blocks_resume_at
    late, now = wall > BLOCKS_LATE_SHARE * cpu, time.perf_counter()
    if not late:
        _blocks_backoff = 0.0
        return
    _blocks_backoff = (min(2 * _blocks_backoff, MAX_BACKOFF_SECONDS) if _blocks_backoff
                       else BACKOFF_SECONDS)
    _blocks_resume_at = now + _blocks_backoff
    if _on_two_threads():
        _note_split(True, now, at_once=True)


def blocks_backing_off():
    """Whether splits in long blocks (note_blocks) run whole now."""
    return _blocks_backoff > 0.0 and time.perf_counter() < _blocks_resume_at


def launch_block(fn, args):
    """Start fn(*args), one block of a split note_blocks measures, on a
    pool thread whatever the shared back-off (blocks_backing_off decides
    whether to split); join_block gives its result."""
    return _start(fn, args, True)


def join_block(job):
    """The result of launch_block's job (its exception raised here); the
    caller runs it if no pool thread took it. Its lateness is the split's
    to note (note_blocks), not the join's."""
    if type(job) is _Ran:
        return job.result
    if not job.work():
        job.done.wait()
    return _result(job)


def _native_split_plan(out_shape, compute, threads, blocks, fallback, even=None):
    """A product of result `out_shape` in `blocks` (axis, edges) on the C
    pool (product_pool.py), or in the edges `even` while helpers come in
    time (helper_punctual, even_rows): the whole product's bits. While
    backing off it is one whole product (product_pool.whole_matmul: the same bits);
    operands BLAS cannot take as laid out go to `fallback` (None: one whole
    product)."""
    axis, edges = blocks
    count = product_pool.block_count(axis, edges)
    empty, matmul, run = np.empty, product_pool.whole_matmul(compute), product_pool.run

    def native_split_matmul(x, y, out=None):
        if backing_off():
            return matmul(x, y, out=out)
        if out is None:
            out = empty(out_shape, compute)
        cut = even if even is not None and helper_punctual() else edges
        done = run(x, y, out, axis, cut, threads)
        if done is None:
            return fallback(x, y, out) if fallback is not None else matmul(x, y, out=out)
        note_pool_split(done, count, threads)
        return out

    # The product on the caller's thread alone, with the split's bits (a
    # launched job's: concurrent_steps.py).
    native_split_matmul.one_thread = matmul
    native_split_matmul.edges = (edges, even)  # as planned, and the even cut (tests)
    return native_split_matmul


def batched_matmul_plan(batch_shape, m, n, k, compute):
    """matmul_plan of a product batched over several axes, x (*batch_shape,
    m, k) @ y (*batch_shape, k, n) as views of any batch strides (np.matmul
    reads them without a copy), where the C pool would split it. Over two
    batch axes (attention's (batch, heads)) it runs on the C pool, its
    blocks whole batches counted over both axes, each batch the gemm call
    np.matmul makes for it (_product_pool.c: the same bits); operands the
    C pool cannot take as laid out (x is y: NumPy calls syrk) are one
    np.matmul. Over more batch axes it runs on the Python pool, one block
    of the longest batch axis per thread, each one np.matmul. On the
    Python pool the helper is a Python thread that takes the GIL to claim
    its block: it came late to most of the transformer's six attention
    products per step, and a caller that ran both blocks counted as a late
    split there (parallel_for), which kept the step's other splits backed
    off (issue 16, fifteenth pass, s15xformer). None where one thread is
    right or the C pool would not take the product: the caller then
    flattens the batch axes (a copy where they do not merge) for
    matmul_plan."""
    b = int(np.prod(batch_shape, dtype=np.int64))
    if not product_pool_takes(b, compute):
        return None
    split = _native_product_split(b, m, n, k, compute)
    if split is None:
        return None
    threads, (_, batch_edges) = split
    if len(batch_shape) <= 2:
        return _native_split_plan((*batch_shape, m, n), compute, threads, (0, batch_edges),
                                  None)
    axis = max(range(len(batch_shape)), key=lambda a: batch_shape[a])
    edges = np.linspace(0, batch_shape[axis], min(threads, batch_shape[axis]) + 1).astype(int)
    lead = (slice(None),) * axis
    blocks = [lead + (slice(lo, hi),) for lo, hi in zip(edges[:-1], edges[1:])]
    out_shape = (*batch_shape, m, n)
    empty, matmul = np.empty, product_pool.whole_matmul(compute)

    def batched_split_matmul(x, y, out=None):
        if backing_off():
            return matmul(x, y, out=out)
        if out is None:
            out = empty(out_shape, compute)

        def part(i):
            index = blocks[i]
            matmul(x[index], y[index], out=out[index])

        parallel_for(part, len(blocks), threads)
        return out

    batched_split_matmul.one_thread = matmul
    return batched_split_matmul


def _python_split_plan(b, m, n, compute, threads):
    """matmul in blocks over the Python pool; None when one block is all."""
    empty, matmul = np.empty, product_pool.whole_matmul(compute)
    if b >= threads:  # enough batches: split them

        def part(x, y, out, lo, hi):
            matmul(x[lo:hi], y[lo:hi], out=out[lo:hi])

        blocks = _blocks(b, threads, min_block=1)
    elif m >= n:
        blocks = _blocks(m, threads)

        def part(x, y, out, lo, hi):
            matmul(x[..., lo:hi, :], y, out=out[..., lo:hi, :])
    else:
        blocks = _blocks(n, threads)

        def part(x, y, out, lo, hi):
            matmul(x, y[..., lo:hi], out=out[..., lo:hi])
    if len(blocks) <= 1:
        return None
    out_shape = (b, m, n) if b else (m, n)

    def split_matmul(x, y, out=None):
        if out is None:
            out = empty(out_shape, compute)
        parallel_for(lambda i: part(x, y, out, *blocks[i]), len(blocks), threads)
        return out

    return split_matmul


# -- products on OpenBLAS' own threads -------------------------------------
# Our pool hands each block to a Python thread: a helper takes the GIL to
# claim its block and again when its BLAS call returns, so on many cores
# the hand-offs queue on the GIL and every block repacks the operand it
# shares with the others. OpenBLAS' own threads (C threads, no GIL) share
# the packed panels. `blas_matmul_plan` runs a product on `threads` of
# them: OpenBLAS is set to that count for the call and back to one after
# it (a ctypes call, about a microsecond). OpenBLAS splits rows and columns
# only, never the inner dimension, as our blocks do.

_blas_setters = None


def blas_thread_setters():
    """The openblas_set_num_threads functions of the pthreads OpenBLAS
    builds loaded in this process (threadpoolctl finds them); empty where
    there are none (another BLAS, OpenMP threading)."""
    global _blas_setters
    if _blas_setters is None:
        setters = []
        try:
            from threadpoolctl import ThreadpoolController

            libs = ThreadpoolController().select(internal_api="openblas").lib_controllers
        except Exception:  # noqa: BLE001 - no threadpoolctl or no BLAS: our pool only
            libs = []
        # Wheels rename OpenBLAS' symbols (scipy-openblas: prefix "scipy_",
        # suffix "64_" for the 64-bit integer build).
        names = [f"{prefix}openblas_set_num_threads{suffix}"
                 for prefix in ("", "scipy_") for suffix in ("", "64_")]
        for lib in libs:
            if getattr(lib, "threading_layer", None) == "pthreads":
                found = [getattr(lib.dynlib, n) for n in names if hasattr(lib.dynlib, n)]
                setters.extend(found[:1])
        _blas_setters = tuple(setters)
    return _blas_setters


# OpenBLAS' thread count is one number for the process: one threaded
# product at a time sets it. Another that finds it taken (a kernel of the
# pool, a user's thread) runs on its own thread, as every product did
# before.
_blas_busy = threading.Lock()


def blas_matmul_plan(threads):
    """np.matmul on `threads` of OpenBLAS' threads (one while backing off
    or while another threaded product runs), or None where OpenBLAS'
    threads cannot be set."""
    setters = blas_thread_setters()
    if threads <= 1 or not setters:
        return None
    matmul, busy = np.matmul, _blas_busy

    def blas_matmul(x, y, out=None):
        if backing_off() or not busy.acquire(blocking=False):
            return matmul(x, y, out=out)
        try:
            for set_threads in setters:
                set_threads(threads)
            return matmul(x, y, out=out)
        finally:
            for set_threads in setters:
                set_threads(1)
            busy.release()

    return blas_matmul


_plans = {}


def matmul(x, y, out=None):
    """np.matmul(x, y) for 2-d or 3-d (batched) float operands, on the
    threads its size is worth (the plan is kept per shape); `out`: the
    result written there, as np.matmul's `out` (each plan's blocks write
    into it: the same bits)."""
    batched = x.ndim == 3
    key = (x.shape, y.shape, x.dtype, batched)
    plan = _plans.get(key, False)
    if plan is False:
        plan = None
        if x.ndim == y.ndim and x.ndim in (2, 3) and x.dtype == y.dtype:
            b = x.shape[0] if batched else 0
            plan = matmul_plan(b, x.shape[-2], y.shape[-1], x.shape[-1], x.dtype)
        if len(_plans) < 4096:
            _plans[key] = plan
    if plan is None:
        return product_pool.matmul(x, y, out=out)
    return plan(x, y, out)
