"""Split float32 and float64 products on the C pool (_product_pool.c):
the blocks run on C threads without the interpreter lock, each one
single-threaded cblas_sgemm (cblas_dgemm) of the OpenBLAS NumPy calls,
and give the bits of NumPy's whole product.

Which OpenBLAS: NumPy's wheels bundle scipy-openblas (numpy.libs/
libscipy_openblas64_-*.so) with 64-bit integers, whose CBLAS is
`scipy_cblas_sgemm64_`; threadpoolctl finds the loaded library and
ctypes the symbol. Elsewhere (NumPy built against MKL or a system BLAS,
another symbol name) there is no C pool and threads.py splits products
over its Python pool as before. Once per process a split product is
checked against np.matmul bit for bit; a mismatch turns the pool off.

The same bits: each element of a product is one sum over the inner
dimension, and OpenBLAS' blocked kernels add it in the same order
whatever rows or columns the call covers, except that a call of at most
SMALL_MATRIX_MNK multiply-adds runs its "small matrix" kernels
(SkylakeX: OpenBLAS' kernel/x86_64/sgemm_small_kernel_permit_skylakex.c),
which sum differently. Measured here (OpenBLAS 0.3.31, SkylakeX, NumPy
2.4): every split of 360 random float32 shapes (m, n, k up to 1200,
transposed operands, 2-16 blocks of rows or columns, linspace edges)
gave the whole product's bits when each block has more than
SMALL_MATRIX_MNK, and blocks below it did not (32x512 @ 512x512 in 16
column blocks).

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

import numpy as np

from keras_ipu.device import native
from keras_ipu.device.flags import env_switch

# _task_pool.h's TASK_POOL_VERSION: the C modules built from these sources.
TASK_POOL_VERSION = 1

SGEMM_SYMBOL = "scipy_cblas_sgemm64_"
DGEMM_SYMBOL = "scipy_cblas_dgemm64_"
# Row blocks of a float64 product start at multiples of this (module doc:
# 3 * DGEMM_UNROLL_N of OpenBLAS' x86-64 kernels).
F64_ROW_ALIGN = 24
# OpenBLAS' small-matrix bound on M * N * K (module doc).
SMALL_MATRIX_MNK = 100 ** 3
# Rows (or columns, batches) per block at least: thinner blocks run BLAS
# below its efficiency (the Python pool's blocks too: threads.py).
MIN_BLOCK = 16

_ready = None
_float64_ready = False


def _numpy_gemm(symbol):
    """The address of `symbol` (a 64-bit-integer CBLAS gemm) in NumPy's
    OpenBLAS, or 0."""
    libs_dir = os.path.join(os.path.dirname(os.path.dirname(np.__file__)), "numpy.libs")
    try:
        from threadpoolctl import ThreadpoolController

        libs = ThreadpoolController().select(internal_api="openblas").lib_controllers
    except Exception:  # noqa: BLE001 - no threadpoolctl or no BLAS: no C pool
        return 0
    for lib in libs:
        if os.path.dirname(os.path.realpath(lib.filepath)) != os.path.realpath(libs_dir):
            continue
        try:
            return ctypes.cast(getattr(lib.dynlib, symbol), ctypes.c_void_p).value or 0
        except AttributeError:
            return 0
    return 0


def available(dtype=np.float32):
    """Whether split products of `dtype` (float32, float64) run on the C
    pool (module doc)."""
    global _ready, _float64_ready
    if _ready is None:
        _ready = False
        if native.split_products is not None:
            single, double = _numpy_gemm(SGEMM_SYMBOL), _numpy_gemm(DGEMM_SYMBOL)
            # An older build (not reinstalled after an update) takes other
            # arguments: no C pool, the Python pool as before it.
            if single and _current(native.split_products):
                from threadpoolctl import threadpool_limits

                native.split_products.set_blas(single, double)
                # np.matmul on one OpenBLAS thread, as the engine runs it
                # (threads.configure) and as each block runs: a threaded
                # dgemm's whole product has other bits.
                with threadpool_limits(limits=1, user_api="blas"):
                    _ready = _bits_check(np.float32)
                    _float64_ready = _ready and bool(double) and _bits_check(np.float64)
                if not _ready:
                    native.split_products.set_blas(0, 0)
                elif not _float64_ready:
                    native.split_products.set_blas(single, 0)
    return _float64_ready if np.dtype(dtype) == np.dtype(np.float64) else _ready


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


def _bits_check(dtype):
    """A split product of each layout, and a batched one, against
    np.matmul, bit for bit (float64: row blocks at F64_ROW_ALIGN)."""
    rng = np.random.default_rng(0)
    xb = rng.standard_normal((6, 40, 24)).astype(dtype)
    yb = rng.standard_normal((6, 24, 33)).astype(dtype)
    whole = np.matmul(xb, yb)
    out = np.empty_like(whole)
    edges = np.array([0, 2, 6], np.int64)
    if native.split_products.product(xb, yb, out, 0, edges, 2) is None:
        return False
    if not np.array_equal(out, whole):
        return False
    x = rng.standard_normal((250, 301)).astype(dtype)
    y = rng.standard_normal((301, 262)).astype(dtype)
    x_t, y_t = np.ascontiguousarray(x.T).T, np.ascontiguousarray(y.T).T  # transposed layouts
    for a, b in ((x, y), (x_t, y), (x, y_t)):
        whole = np.matmul(a, b)
        for axis in (0, 1) if dtype == np.float32 else (0,):
            edges = np.array([0, 120, whole.shape[axis]], np.int64)
            out = np.empty_like(whole)
            if native.split_products.product(a, b, out, axis, edges, 2) is None:
                return False
            if not np.array_equal(out, whole):
                return False
    return True


def blocks(m, n, k, threads, per_thread, dtype=np.float32):
    """(axis, int64 edges) splitting an (m, k) @ (k, n) product into about
    threads * per_thread blocks along its longer side of the result (a
    float64 one: its rows, at multiples of F64_ROW_ALIGN), each above
    SMALL_MATRIX_MNK and MIN_BLOCK wide; None when fewer than two such
    blocks fit."""
    align = F64_ROW_ALIGN if np.dtype(dtype) == np.dtype(np.float64) else 1
    axis = 0 if m >= n or align > 1 else 1
    size, other = (m, n) if axis == 0 else (n, m)
    count = min(threads * per_thread, size // max(MIN_BLOCK, align))
    while count >= 2:
        edges = np.linspace(0, size, count + 1).astype(np.int64)
        edges[1:-1] -= edges[1:-1] % align
        widths = np.diff(edges)
        if widths.min() >= MIN_BLOCK and widths.min() * other * k > SMALL_MATRIX_MNK:
            return axis, edges
        count -= 1
    return None


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


def helper_count():
    """C threads the pool has started (tests)."""
    pool = native.split_products
    return pool.helper_count() if pool is not None else 0
