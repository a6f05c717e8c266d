"""Host memory settings for running compiled programs in NumPy.

A compiled step allocates and frees the same arrays every time it runs.
glibc's malloc serves blocks above its mmap threshold (128 KiB at first)
with fresh mmap()s, and gives the top of the heap back to the system once
more than the trim threshold is free: either way the next run touches new
pages, and the kernel zero-fills each on its first fault. On an LSTM step
(hundreds of 64-256 KiB arrays per step) that was about half the time.
Raising both thresholds keeps those blocks in the heap for reuse, as
XLA's and TensorFlow's own allocators keep their buffers.

Applied once, when the first program is lowered, through mallopt (glibc
only; elsewhere nothing happens). KERAS_IPU_HOST_MALLOC=0 leaves malloc
alone. The cost: up to the trim threshold of freed memory stays mapped.

The outputs a program hands to TensorFlow (the TensorFlow front end writes
a step's updated variables back into their tf.Variables) are allocated
aligned to `ALIGNMENT` bytes (`empty_aligned`). TensorFlow wraps a NumPy
array as a tensor without copying it only when its data are aligned to
Eigen's EIGEN_MAX_ALIGN_BYTES (64 in TensorFlow's x86 builds), and an eager
AssignVariableOp then keeps that buffer as the variable's new value; malloc
aligns to 16 bytes, so most arrays were copied once more on their way
back (ResNet-50's 200 MB of weights and momenta per step). A test checks
that TensorFlow still takes them without a copy.
"""

import ctypes
import ctypes.util

import numpy as np

from keras_ipu.device.flags import env_switch

# mallopt parameter numbers from <malloc.h>.
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
# Blocks up to this size come from the heap (glibc's own dynamic ceiling).
MMAP_THRESHOLD = 32 * 1024 * 1024
# Free memory kept at the top of the heap before it is returned.
TRIM_THRESHOLD = 512 * 1024 * 1024

_applied = None


def tune_malloc():
    """Raise malloc's mmap and trim thresholds (once). Returns whether the
    settings are in effect."""
    global _applied
    if _applied is not None:
        return _applied
    _applied = False
    if not env_switch("KERAS_IPU_HOST_MALLOC"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False  # not glibc: its allocator has its own policy
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    ok = mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
    ok = mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1 and ok
    _applied = ok
    return ok


# TensorFlow's CPU tensor alignment (Eigen's EIGEN_MAX_ALIGN_BYTES): the
# alignment at which it shares a NumPy array's memory instead of copying.
ALIGNMENT = 64
# Smaller arrays stay plain np.empty: TensorFlow copies them in less time
# than aligning takes (about 2 us: the address costs a ctypes call).
ALIGN_MIN_BYTES = 64 * 1024

_buffer_of = ctypes.c_char.from_buffer
_address = ctypes.addressof


def empty_aligned(shape, dtype):
    """np.empty(shape, dtype), its data aligned to ALIGNMENT bytes when it
    has at least ALIGN_MIN_BYTES (a view into a slightly larger block)."""
    dtype = np.dtype(dtype)
    nbytes = dtype.itemsize
    for n in shape:
        nbytes *= n
    if nbytes < ALIGN_MIN_BYTES:
        return np.empty(shape, dtype)
    block = np.empty(nbytes + ALIGNMENT, np.uint8)
    offset = -_address(_buffer_of(block)) % ALIGNMENT
    return np.ndarray(shape, dtype, block, offset)
