"""Whether TensorFlow's graph runtime runs its oneDNN kernels.

TensorFlow turns them on by default only on CPUs with AVX-512 VNNI / BF16
/ AMX (or with TF_ENABLE_ONEDNN_OPTS=1); elsewhere (AMD hosts, older Intel
ones) its Eigen kernels run, and some of those differ: MaxPool3DGrad
credits every tied maximum of a window rather than the first one. The
graph mode's rules ask here and leave such operations to another engine.
"""

import functools


@functools.cache
def onednn_enabled():
    """Unknown counts as off: the program then runs elsewhere, never wrong."""
    try:
        from tensorflow.python.util import _pywrap_util_port
        return bool(_pywrap_util_port.IsMklEnabled())
    except (ImportError, AttributeError):
        return False
