"""Split float32 and float64 products on the C pool (_product_pool.c):
the blocks run on C threads without the interpreter lock, each one
single-threaded cblas_sgemm (cblas_dgemm) of the OpenBLAS NumPy calls,
and give the bits of NumPy's whole product; or, for float32 on a CPU with
AVX-512, each one call of keras_ipu's own kernel (_gemm.h, native_gemm),
giving the bits of its whole call (matmul), which the engine's float32
products then run on one thread too (whole_matmul).

Our kernel: the machine's environment may pin NumPy's OpenBLAS to
kernels below the CPU's (OPENBLAS_CORETYPE=Haswell on the AVX-512 AMD
EPYC VM: its AVX2 sgemm, 101-126 GFLOP/s on the MLP's and
demo_functional's products on one core), which the library does not
override; our kernel ran those products at 230-260 GFLOP/s there, NN, TN
and NT (issue 16, twenty-first pass, s21gemm; OpenBLAS' own SkylakeX
kernels 103-243; demo_functional's 32-row input gradient, NT, since the
twenty-second pass: _gemm.h's gemm_nt_by_rows).
Every element it computes is one sequential chain of float32 FMAs over
the inner dimension, whatever the block and the layout: its rule is rows
and columns anywhere (ANYWHERE), with no small-matrix kernel, which the
check below confirms at first use (else OpenBLAS' blocks as before).
`KERAS_IPU_NATIVE_GEMM=0` keeps OpenBLAS (NumPy's bits) everywhere.

Which OpenBLAS: NumPy's wheels bundle scipy-openblas (numpy.libs/
libscipy_openblas64_-*.so) with 64-bit integers, whose CBLAS is
`scipy_cblas_sgemm64_`; threadpoolctl finds the loaded library and
ctypes the symbol. Elsewhere (NumPy built against MKL or a system BLAS,
another symbol name) there is no C pool and threads.py splits products
over its Python pool as before.

Which blocks: once per process (rule, _find_rule) split products are
checked against the whole product (np.matmul on one OpenBLAS thread, as
the engine runs it, or our kernel's whole call) bit for bit, to find the
Rule this BLAS keeps: rows anywhere, or at multiples of 12 or 24 (ROW_ALIGNS), or not at all; columns anywhere, or
at OpenBLAS' own column tiles (column_tiles), or not at all. A batched
product that does not keep its bits turns the pool off. blocks() plans
with the Rule.

SkylakeX (the first host, OpenBLAS 0.3.31, NumPy 2.4): rows and columns
anywhere. Each element of a product is one sum over the inner
dimension, and OpenBLAS' blocked kernels add it in the same order
whatever rows or columns the call covers, except that a call of at most
SMALL_MATRIX_MNK multiply-adds runs its "small matrix" kernels
(kernel/x86_64/sgemm_small_kernel_permit_skylakex.c), which sum
differently. Measured there: every split of 360 random float32 shapes
(m, n, k up to 1200, transposed operands, 2-16 blocks of rows or
columns, linspace edges) gave the whole product's bits when each block
has more than SMALL_MATRIX_MNK, and blocks below it did not (32x512 @
512x512 in 16 column blocks).

Haswell and Zen kernels (the AMD EPYC host: threadpoolctl's architecture
'Haswell', AVX2; OpenBLAS 0.3.31): rows at multiples of 12, columns at
column_tiles. For a row-major product OpenBLAS computes C^T = B^T A^T in
column-major order: our rows are its N, our columns its M. Its level-3
driver (driver/level3/level3.c) cuts M into tiles (SGEMM_P = 320 wide
while two are left, the rest in two halves, the first rounded up to
SGEMM_UNROLL_M = 8, or one) and hands N to the kernel in chunks of
3 * SGEMM_UNROLL_N = 12; the sgemm kernel (sgemm_kernel_8x4_haswell_2.c)
sums the first and last 8 columns of each tile in its 12-row path with
two accumulators (even and odd k) and the others with one, so a column
block must be whole tiles cut as the whole product cuts them, and a row
block must start at a multiple of 12. One more: a row tail (m % 12) of
8 to 11 rows runs as two 4-row kernel calls (two accumulators again) in
the first tile the driver packs and as one 8-row call in the others,
so the tiles of one call keep the bits only for a tail below 8
(tiles_rows_ok); blocks() then cuts rectangles (_product_pool.c's axis
2): the rows above the tail in column tiles, the tail rows in one block
of all columns. Measured here (single OpenBLAS thread): 716 plans of
blocks() on 380 random shapes (2-2600 per side, four layouts, 2-16
threads) gave the whole product's bits, all of them; the lead's row
blocks at multiples of 12 (or 24), 1,540 of 1,540; rows at 4, 8, 16 or
32 and columns at any alignment (1-64) differed most of the time.
There is no small-matrix kernel on Haswell (SMALL_MATRIX_MNK keeps
blocks big enough anyway).

float64 2-d products split in row blocks whose edges are multiples of
F64_ROW_ALIGN only. Measured here (same machine, 150 random shapes up to
1000 per side, 2-8 blocks, each above SMALL_MATRIX_MNK): dgemm blocks
with arbitrary edges differed from the whole product in 35-75% of the
splits (rows or columns); row blocks at multiples of 24 rows gave the
whole product's bits in 521 of 521, at multiples of 8, 16 or 32 in about
40%, and column blocks at no alignment tried (8-48) reliably. Why: for
a row-major product OpenBLAS computes C^T = B^T A^T in column-major
order, so our rows are its N dimension, which its level-3 driver
(driver/level3/level3.c) packs and hands to the micro-kernel in chunks
of 3 * DGEMM_UNROLL_N columns (8 on SkylakeX and Haswell: 24), and the
SkylakeX dgemm kernel has separate paths for those chunk widths, which
round differently; blocks starting at multiples of 24 rows see the same
chunks as the whole product. Our columns are its M dimension, whose
chunks (GEMM_P, halved when the extent is between one and two GEMM_P)
depend on the extent of the block itself: no alignment fixes that.
float64 products that cannot split so keep the Python pool (and its
tolerance); the once-per-process check covers float64 separately.

Batched products (the transformer's attention: x (b, m, k) @ y
(b, k, n)) split along the batches: each batch is one whole gemm call
with the arguments NumPy's matmul loop passes for that batch, so the bits
are NumPy's at any split and any size (no small-matrix bound to respect).

The pool runs any job of independent tasks (_task_pool.h): the C chains
and row sums of _elementwise.c split on it too (tasks_available).
"""

import ctypes
import os
from typing import NamedTuple

import numpy as np

from keras_ipu.device import native
from keras_ipu.device.flags import env_switch

# _task_pool.h's TASK_POOL_VERSION: the C modules built from these sources.
TASK_POOL_VERSION = 3

SGEMM_SYMBOL = "scipy_cblas_sgemm64_"
DGEMM_SYMBOL = "scipy_cblas_dgemm64_"
# Row blocks of a float64 product start at multiples of this (module doc:
# 3 * DGEMM_UNROLL_N of OpenBLAS' x86-64 kernels).
F64_ROW_ALIGN = 24
# Row alignments the float32 check tries where rows do not split anywhere
# (module doc): 3 * SGEMM_UNROLL_N of OpenBLAS' Haswell and Zen sgemm (4),
# then 3 * 8.
ROW_ALIGNS = (12, 24)
# OpenBLAS' Haswell and Zen SGEMM_DEFAULT_P and SGEMM_DEFAULT_UNROLL_M
# (param.h): the column tiles of its level-3 driver (column_tiles).
SGEMM_P = 320
SGEMM_UNROLL_M = 8
# OpenBLAS' small-matrix bound on M * N * K (module doc).
SMALL_MATRIX_MNK = 100 ** 3
# A split's helper starts its block after the caller starts its own: it
# wakes (a futex, on a VM an idle virtual core) and packs its operand
# while the caller, which published the split, claims the first block at
# once. Measured on the 2-core AMD VM (issue 16, fourteenth pass, s14mlp;
# 300 calls each, 100 us of Python between calls, autogroup -15, load 9):
# the helper ended 170-320 us after the caller with even row blocks, and
# cuts that gave the caller more rows ran faster (median wall, us):
# 128x784 @ 784x512 cut at 60 / 72 / 84 rows 1121 / 928 / 1019; 128x512 @
# 512x512 743 / 607 / 640; 784x128 @ 128x512 at 396 / 420 / 444 1024 /
# 980 / 913; 512x128 @ 128x512 at 252 / 276 / 300 697 / 643 / 633. So of
# two row blocks the first (the caller's) is larger by half the work one
# core does in the helper's lateness, HELPER_LATE_FLOPS (about 100 us at
# ~90 GFLOP/s): 72, 72, 432 and 288 rows of those four.
HELPER_LATE_FLOPS = 9_000_000
# Rows (or columns, batches) per block at least: thinner blocks run BLAS
# below its efficiency (the Python pool's blocks too: threads.py).
MIN_BLOCK = 16
# Our kernel (native_gemm) runs a product's columns in strips of this many
# (_gemm.h's GEMM_NR); a strip of 17-31 columns (masked) costs what a
# whole one does, one of 16 or fewer (half) most of it: one core, 128x784
# @ 784xw, w = 16 / 32 / 43 / 48 / 64 columns 22 / 26 / 47 / 47 / 51 us;
# 64x8192 @ 8192xw, w = 16 / 32 / 48 / 64: 113 / 155 / 318 / 322 us (issue
# 16, twenty-second pass, s22tidy). So where it runs, a plan of more than
# two column blocks cuts them at whole strips, or at half strips where
# the blocks wanted outnumber the strips, as many blocks as share them
# evenly (blocks): the MLP's 128x784 @ 784x512 at 12 threads in 8 blocks
# of 64 columns, not 12 of 42-43 (each a strip and a masked strip: 40%
# more CPU for the same wall); the transformer's 64x8192 @ 8192x128 at 16
# in 8 half strips (a quarter less wall than 4 strips). Two blocks stay
# as the two-thread plans were measured.
KERNEL_STRIP = 32


class Rule(NamedTuple):
    """Which blocks of a 2-d product of one dtype give np.matmul's bits
    on this host's BLAS (module doc); the check finds it once per process."""

    rows: int      # row blocks start at multiples of this (1: anywhere); 0: none
    columns: str   # "any", "tiles" (column_tiles' edges; rows: tiles_rows_ok) or ""


_rules = None  # {np.dtype: Rule or None}
_native = False  # float32 blocks run our kernel (native_gemm)
ANYWHERE = Rule(1, "any")
_FLOAT32 = np.dtype(np.float32)
_empty, _np_matmul = np.empty, np.matmul


def _whole(x, y, out):
    return native.split_products.whole(x, y, out)


def numpy_wheels_library(filepath):
    """Whether the loaded library at `filepath` (threadpoolctl's) is one
    NumPy's wheels bundle (numpy.libs/, beside the numpy package): the
    OpenBLAS np.matmul calls, not another loaded beside it (SciPy's, a
    system one). One NumPy per process: any numpy.libs is its own."""
    return os.path.basename(os.path.dirname(filepath or "")) == "numpy.libs"


def _numpy_gemm(symbol):
    """The address of `symbol` (a 64-bit-integer CBLAS gemm) in NumPy's
    OpenBLAS, or 0."""
    try:
        from threadpoolctl import ThreadpoolController

        libs = ThreadpoolController().select(internal_api="openblas").lib_controllers
    except Exception:  # noqa: BLE001 - no threadpoolctl or no BLAS: no C pool
        return 0
    for lib in libs:
        if not numpy_wheels_library(lib.filepath):
            continue
        try:
            return ctypes.cast(getattr(lib.dynlib, symbol), ctypes.c_void_p).value or 0
        except AttributeError:
            return 0
    return 0


def rule(dtype=np.float32):
    """This host's Rule for products of `dtype` (float32, float64); None
    where they do not split on the C pool (module doc)."""
    global _rules, _native
    if _rules is None:
        ours = env_switch("KERAS_IPU_NATIVE_GEMM")  # a misspelt value raises here, every time
        _rules = {}
        pool = native.split_products
        if pool is not None and _current(pool):
            single, double = _numpy_gemm(SGEMM_SYMBOL), _numpy_gemm(DGEMM_SYMBOL)
            # An older build (not reinstalled after an update) has no
            # kernel of ours: OpenBLAS' blocks as before it.
            choose = getattr(pool, "set_native_gemm", None)
            _native = bool(choose is not None and choose(ours))
            if single or _native:
                from threadpoolctl import threadpool_limits

                pool.set_blas(single, double)
                # np.matmul on one OpenBLAS thread, as the engine runs it
                # (threads.configure) and as each block runs: a threaded
                # dgemm's whole product has other bits.
                with threadpool_limits(limits=1, user_api="blas"):
                    found = _find_rule(np.float32)
                    if _native and found != ANYWHERE:
                        # Our kernel's blocks must give its whole call's
                        # bits anywhere (_gemm.h); else OpenBLAS' as before.
                        _native = choose(False)
                        found = _find_rule(np.float32) if single else None
                    _rules[np.dtype(np.float32)] = found
                    if found is not None and double:
                        _rules[np.dtype(np.float64)] = _find_rule(np.float64)
                if found is None:
                    pool.set_blas(0, 0)
                elif _rules.get(np.dtype(np.float64)) is None:
                    pool.set_blas(single, 0)
    return _rules.get(np.dtype(dtype))


def native_gemm():
    """Whether float32 products of the C pool run keras_ipu's own AVX-512
    kernel (_gemm.h) rather than NumPy's OpenBLAS: this CPU has AVX-512,
    `KERAS_IPU_NATIVE_GEMM` is not 0 and the check found its blocks give
    the whole call's bits anywhere (module doc)."""
    rule()
    return _native


def matmul(x, y, out=None):
    """np.matmul(x, y, out=out) with the bits of this host's split
    products: our kernel's whole call for float32 operands the C pool
    takes where it runs (native_gemm), np.matmul otherwise (and for
    operands it does not take)."""
    if _rules is None:
        rule()
    if (_native and x.dtype == _FLOAT32 and y.dtype == _FLOAT32 and x.ndim == y.ndim
            and x.ndim >= 2):
        # Allocated before whole() may refuse the operands: it checks the
        # result's layout too. A refusal (zero sizes, over four axes,
        # broadcast batches, strides BLAS cannot read) wastes one np.empty;
        # the five benchmark models' steps had none at 2 or 16 threads.
        result = _empty(x.shape[:-1] + y.shape[-1:], _FLOAT32) if out is None else out
        if _whole(x, y, result) is not None:
            return result
    return _np_matmul(x, y, out=out)


def whole_matmul(dtype):
    """The function computing a whole product of `dtype` on one thread
    with the bits of its splits on the C pool: matmul where float32 runs
    our kernel, else np.matmul."""
    return matmul if np.dtype(dtype) == _FLOAT32 and native_gemm() else np.matmul


def available(dtype=np.float32):
    """Whether split products of `dtype` (float32, float64) run on the C
    pool (module doc)."""
    return rule(dtype) is not None


def _current(module):
    """Whether a C module was built with these sources' task interface
    (_elementwise's TASK_POOL_VERSION; _product_pool's capsule, whose
    version _elementwise checks): an editable install not rebuilt after an
    update keeps older modules, whose calls take fewer arguments."""
    return getattr(module, "TASK_POOL_VERSION", None) == TASK_POOL_VERSION or hasattr(
        module, "_task_pool")


def tasks_available():
    """Whether the C chains and row sums split on the C pool (both modules
    built, and current, and `KERAS_IPU_PRODUCT_POOL` is not 0); no BLAS
    needed."""
    return (native.split_products is not None and native.elementwise is not None
            and _current(native.split_products) and _current(native.elementwise)
            and env_switch("KERAS_IPU_PRODUCT_POOL"))


def _layouts(rng, m, k, n, dtype):
    """x (m, k) and y (k, n) in each layout NumPy hands BLAS (plain or
    transposed)."""
    x = rng.standard_normal((m, k)).astype(dtype)
    y = rng.standard_normal((k, n)).astype(dtype)
    x_t, y_t = np.ascontiguousarray(x.T).T, np.ascontiguousarray(y.T).T
    return (x, y), (x_t, y), (x, y_t), (x_t, y_t)


def _splits_match(pairs, axis, edges):
    """Whether `edges` along `axis` (2: rectangles) give the whole
    product's bits (matmul's) for every pair of operands."""
    edges = np.asarray(edges, np.int64)
    for a, b in pairs:
        whole = matmul(a, b)
        out = np.empty_like(whole)
        if native.split_products.product(a, b, out, axis, edges, 2) is None:
            return False
        if not np.array_equal(out, whole):
            return False
    return True


def _find_rule(dtype):
    """The Rule this BLAS keeps for `dtype`, or None: a batched product,
    then row blocks anywhere or at each of ROW_ALIGNS (float64: at
    F64_ROW_ALIGN only), then column blocks anywhere or at column_tiles'
    edges, against np.matmul bit for bit."""
    rng = np.random.default_rng(0)
    xb = rng.standard_normal((6, 40, 24)).astype(dtype)
    yb = rng.standard_normal((6, 24, 33)).astype(dtype)
    if not _splits_match([(xb, yb)], 0, [0, 2, 6]):
        return None
    pairs = _layouts(rng, 250, 97, 262, dtype)
    if np.dtype(dtype) == np.dtype(np.float64):
        return Rule(F64_ROW_ALIGN, "") if _splits_match(
            pairs, 0, [0, 5 * F64_ROW_ALIGN, 250]) else None
    rows = next((align for align in (1,) + ROW_ALIGNS
                 if _splits_match(pairs, 0, [0, 5 * align, 10 * align, 250]
                                  if align > 1 else [0, 125, 250])), 0)
    if _splits_match(pairs, 1, [0, 120, 262]):
        return Rule(rows, "any")
    if rows > 1:
        wide = SGEMM_P * 3 + 40  # four tiles, the last two halves
        tail = 2 * rows // 3 - 1  # the longest row tail tiles_rows_ok allows
        if (_splits_match(_layouts(rng, 3 * rows + tail, 97, wide, dtype), 1,
                          column_tiles(wide))
                and _splits_match(_layouts(rng, 3 * rows + tail + 1, 97, wide, dtype), 2,
                                  _tiles_and_tail(3 * rows + tail + 1, wide, rows,
                                                  column_tiles(wide)))):
            return Rule(rows, "tiles")
    return Rule(rows, "") if rows else None


def column_tiles(n):
    """int64 edges of the column tiles OpenBLAS' level-3 driver
    (driver/level3/level3.c) cuts an n-column product into, its M
    dimension: SGEMM_P wide while at least two are left, then the rest in
    two (the first half rounded up to SGEMM_UNROLL_M) or one."""
    edges = [0]
    while edges[-1] < n:
        left = n - edges[-1]
        if left >= 2 * SGEMM_P:
            width = SGEMM_P
        elif left > SGEMM_P:
            width = -(-(left // 2) // SGEMM_UNROLL_M) * SGEMM_UNROLL_M
        else:
            width = left
        edges.append(edges[-1] + width)
    return np.array(edges, np.int64)


def tiles_rows_ok(m, align):
    """Whether an m-row product's column tiles keep its bits (module doc):
    its last m % align rows are fewer than 2 * align / 3."""
    return m % align < 2 * align // 3


def _tile_groups(n, count):
    """int64 edges of about `count` column blocks of whole column_tiles,
    each cut as OpenBLAS cuts the whole product; None when fewer than two."""
    tiles = column_tiles(n)
    for c in range(min(count, len(tiles) - 1), 1, -1):
        wanted = np.linspace(0, n, c + 1)[1:-1]
        cuts = np.unique(tiles[np.abs(tiles[None, :] - wanted[:, None]).argmin(axis=1)])
        edges = np.concatenate(([0], cuts[(cuts > 0) & (cuts < n)], [n])).astype(np.int64)
        if len(edges) > 2 and all(
                np.array_equal(column_tiles(hi - lo) + lo, tiles[(tiles >= lo) & (tiles <= hi)])
                for lo, hi in zip(edges[:-1], edges[1:])):
            return edges
    return None


def _tiles_and_tail(m, n, align, edges):
    """Rectangles (rows lo, hi, columns lo, hi) of an m-row product whose
    last rows keep it from column tiles (tiles_rows_ok): the rows above
    them in the column blocks `edges`, those rows in one block."""
    top = m - m % align
    rects = [(0, top, lo, hi) for lo, hi in zip(edges[:-1], edges[1:])]
    return np.array(rects + [(top, m, 0, n)], np.int64)


def side_edges(size, other, k, count, align):
    """int64 edges of about `count` blocks along a side of `size` (the
    other side `other`, inner dimension k), starting at multiples of
    `align` (rounded to the nearest), each MIN_BLOCK wide and above
    SMALL_MATRIX_MNK; None when fewer than two fit."""
    count = min(count, size // max(MIN_BLOCK, align))
    while count >= 2:
        edges = np.linspace(0, size, count + 1)
        edges[1:-1] = np.round(edges[1:-1] / align) * align
        edges = edges.astype(np.int64)
        widths = np.diff(edges)
        if widths.min() >= MIN_BLOCK and widths.min() * other * k > SMALL_MATRIX_MNK:
            return edges
        count -= 1
    return None


def _caller_first(edges, m, n, k, align):
    """Two row blocks `edges` of an (m, k) @ (k, n) product cut so that the
    first, which the caller claims while its helper wakes, holds
    HELPER_LATE_FLOPS / 2 more work than the second, at the alignment;
    `edges` where the second block would be under MIN_BLOCK rows or
    SMALL_MATRIX_MNK."""
    cut = int(np.round((m / 2 + HELPER_LATE_FLOPS / (4 * n * k)) / align)) * align
    if edges[1] < cut and m - cut >= MIN_BLOCK and (m - cut) * n * k > SMALL_MATRIX_MNK:
        return np.array([0, cut, m], np.int64)
    return edges


def blocks(m, n, k, threads, per_thread, dtype=np.float32, rectangles=True):
    """(axis, edges) splitting an (m, k) @ (k, n) product into about
    threads * per_thread blocks that keep its bits here (rule): along its
    longer side where this host's rule allows, else the other; axis 2:
    rectangles (rows lo, hi, columns lo, hi), the rows column tiles cannot
    take in one block of their own (not with `rectangles` False). Each
    block above SMALL_MATRIX_MNK and MIN_BLOCK wide; None when fewer than
    two such blocks fit. Two row blocks go before rectangles (see below),
    the first the larger (_caller_first)."""
    found = rule(dtype)
    if found is None:
        return None
    count = threads * per_thread
    rows = None if not found.rows else side_edges(m, n, k, count, found.rows)
    if rows is not None and len(rows) == 3:
        rows = _caller_first(rows, m, n, k, found.rows)
    columns = None
    if found.columns == "any":
        if count > 2 and _native and np.dtype(dtype) == _FLOAT32:
            unit = KERNEL_STRIP if n >= count * KERNEL_STRIP else KERNEL_STRIP // 2
            units = -(-n // unit)
            per_block = -(-units // count)
            columns = side_edges(n, m, k, -(-units // per_block), unit)
        else:
            columns = side_edges(n, m, k, count, 1)
    elif found.columns == "tiles":
        whole_rows = tiles_rows_ok(m, found.rows)
        # Beside a row tail's block, at least two column blocks.
        edges = _tile_groups(n, count if whole_rows else max(count - 1, 2))
        top = m if whole_rows else m - m % found.rows
        if edges is not None and np.diff(edges).min() * top * k > SMALL_MATRIX_MNK:
            if whole_rows:
                columns = edges
            elif rectangles and (m - top) * n * k > SMALL_MATRIX_MNK:
                columns = _tiles_and_tail(m, n, found.rows, edges)
    planned = [(0, rows), (2 if columns is not None and columns.ndim == 2 else 1, columns)]
    # The longer side first; but two row blocks before rectangles: each
    # block packs the whole of y once, as the rectangles' column blocks
    # together and their tail's block do, in one task fewer.
    if m < n and not (planned[1][0] == 2 and rows is not None and len(rows) <= 3):
        planned.reverse()
    return next(((axis, edges) for axis, edges in planned if edges is not None), None)


def row_tail(m, n, k, dtype=np.float32):
    """int64 edges [0, top, m] of an (m, k) @ (k, n) product in two row
    blocks that keep its bits here (rule): the rows above its tail at the
    row alignment, and the tail, where two aligned blocks of MIN_BLOCK
    rows do not fit (32 rows at 12: 24 and 8); None where there is no such
    tail, or the top block is under MIN_BLOCK rows or SMALL_MATRIX_MNK.
    The tail's block costs its caller most of the top's (each packs the
    whole of y): only a split in two gains, the top on the thread that
    publishes the split (it claims the first block), the tail on a helper
    that may wake late (threads.row_tail_split)."""
    found = rule(dtype)
    if found is None or found.rows <= 1:
        return None
    top = m - m % found.rows
    if top == m or top < MIN_BLOCK or top * n * k <= SMALL_MATRIX_MNK:
        return None
    return np.array([0, top, m], np.int64)


def block_count(axis, edges):
    """How many blocks blocks' (axis, edges) are."""
    return len(edges) if axis == 2 else len(edges) - 1


def batch_blocks(b, threads, per_thread):
    """int64 edges splitting b batches into about threads * per_thread
    blocks of whole batches; None when fewer than two."""
    count = min(threads * per_thread, b)
    if count < 2:
        return None
    return np.linspace(0, b, count + 1).astype(np.int64)


def run(x, y, out, axis, edges, threads):
    """out = x @ y in the blocks `edges` (3-d operands: of batches, axis
    0) on up to `threads` threads:
    (blocks the caller ran, its own seconds, its wait for the helpers), or
    None (nothing written) where BLAS cannot take the operands as they are
    laid out."""
    return native.split_products.product(x, y, out, axis, edges, threads)


def split_timing():
    """(delay, imbalance) in seconds of the last split the C pool ran with
    a helper (_product_pool.c's stamps): from its publication to its
    helper's first block (negative: no helper claimed one), and how much
    later the thread that ran block 1 finished than the one that ran block
    0 (of two blocks, one each); None without the pool or in an older
    build (benchmarks/split_timing.py)."""
    timing = getattr(native.split_products, "split_timing", None)
    return None if timing is None else timing()


def helper_count():
    """C threads the pool has started (tests)."""
    pool = native.split_products
    return pool.helper_count() if pool is not None else 0
