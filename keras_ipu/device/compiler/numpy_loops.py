"""NumPy's own float32 inner loops, for the C fused chains to call.

NumPy's float32 exp, log, tanh, ... are its own SIMD code, whose results
differ in the last bit from libm's (and from one CPU's dispatch target to
another's). A C kernel that wants NumPy's bits calls the loop NumPy's ufunc
runs on a contiguous float32 array: `ufunc._resolve_dtypes_and_context` and
`ufunc._get_strided_loop` (NumPy >= 1.24, documented there as unstable but
with a stable loop signature) hand it out in a capsule. A NumPy without
them, or a loop needing Python, gives None: the chain stays in NumPy.
"""

import numpy as np

from keras_ipu.device import native

_F32 = np.dtype(np.float32)
_LOOPS = {}  # ufunc -> capsule or None; the capsule owns the loop's data


def float32_loop(ufunc):
    """The capsule of NumPy's loop computing the unary `ufunc` from a
    contiguous float32 array into one, or None when there is none to call
    without Python."""
    if ufunc in _LOOPS:
        return _LOOPS[ufunc]
    capsule = None
    if native.elementwise is not None and ufunc.nin == 1 and ufunc.nout == 1:
        try:
            dtypes, capsule = ufunc._resolve_dtypes_and_context((_F32, _F32))
            ufunc._get_strided_loop(capsule, fixed_strides=(4, 4))
        except (AttributeError, TypeError, ValueError):
            capsule = None
        else:
            usable = getattr(native.elementwise, "loop_usable", None)
            if dtypes != (_F32, _F32) or usable is None or not usable(capsule):
                capsule = None
    _LOOPS[ufunc] = capsule
    return capsule
