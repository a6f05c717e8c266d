"""Split float32 products on the C pool (_product_pool.c): the blocks run
on C threads without the interpreter lock, each one single-threaded
cblas_sgemm of the OpenBLAS NumPy calls, and give the bits of NumPy's
whole product.

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
column blocks). float64 is not split here: OpenBLAS' dgemm blocks
differed from the whole in a column at the edge of some splits above
that bound (e.g. 268x126 @ 126x985 in 8 column blocks), cause not found;
float64 products keep the Python pool (and its tolerance).

Batched float32 products (the transformer's attention: x (b, m, k) @ y
(b, k, n)) split along the batches: each batch is one whole sgemm call
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

SGEMM_SYMBOL = "scipy_cblas_sgemm64_"
# OpenBLAS' small-matrix bound on M * N * K (module doc).
SMALL_MATRIX_MNK = 100 ** 3
# Rows (or columns, batches) per block at least: thinner blocks run BLAS
# below its efficiency (the Python pool's blocks too: threads.py).
MIN_BLOCK = 16

_ready = None


def _numpy_sgemm():
    """The address of NumPy's OpenBLAS cblas_sgemm (64-bit integers), or 0."""
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
            return ctypes.cast(getattr(lib.dynlib, SGEMM_SYMBOL), ctypes.c_void_p).value or 0
        except AttributeError:
            return 0
    return 0


def available():
    """Whether split float32 products run on the C pool (module doc)."""
    global _ready
    if _ready is None:
        _ready = False
        if native.split_products is not None:
            address = _numpy_sgemm()
            if address:
                native.split_products.set_blas(address)
                _ready = _bits_check()
                if not _ready:
                    native.split_products.set_blas(0)
    return _ready


def tasks_available():
    """Whether the C chains and row sums split on the C pool (the module
    is built and `KERAS_IPU_PRODUCT_POOL` is not 0); no BLAS needed."""
    return native.split_products is not None and env_switch("KERAS_IPU_PRODUCT_POOL")


def _bits_check():
    """A split product of each layout, and a batched one, against
    np.matmul, bit for bit."""
    rng = np.random.default_rng(0)
    xb = rng.standard_normal((6, 40, 24)).astype(np.float32)
    yb = rng.standard_normal((6, 24, 33)).astype(np.float32)
    whole = np.matmul(xb, yb)
    out = np.empty_like(whole)
    edges = np.array([0, 2, 6], np.int64)
    if native.split_products.product(xb, yb, out, 0, edges, 2) is None:
        return False
    if not np.array_equal(out, whole):
        return False
    x = rng.standard_normal((250, 301)).astype(np.float32)
    y = rng.standard_normal((301, 262)).astype(np.float32)
    x_t, y_t = np.ascontiguousarray(x.T).T, np.ascontiguousarray(y.T).T  # transposed layouts
    for a, b in ((x, y), (x_t, y), (x, y_t)):
        whole = np.matmul(a, b)
        for axis in (0, 1):
            edges = np.array([0, 128, whole.shape[axis]], np.int64)
            out = np.empty_like(whole)
            if native.split_products.product(a, b, out, axis, edges, 2) is None:
                return False
            if not np.array_equal(out, whole):
                return False
    return True


def blocks(m, n, k, threads, per_thread):
    """(axis, int64 edges) splitting an (m, k) @ (k, n) product into about
    threads * per_thread blocks along its longer side of the result, each
    above SMALL_MATRIX_MNK and MIN_BLOCK wide; None when fewer than two
    such blocks fit."""
    axis = 0 if m >= n else 1
    size, other = (m, n) if axis == 0 else (n, m)
    count = min(threads * per_thread, size // MIN_BLOCK)
    while count >= 2 and (size // count) * other * k <= SMALL_MATRIX_MNK:
        count -= 1
    if count < 2:
        return None
    return axis, np.linspace(0, size, count + 1).astype(np.int64)


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
