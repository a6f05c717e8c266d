"""keras_ipu's optional C kernels, built when the project is installed
(hatch_build.py). `elementwise` is the extension module, or None when it
was not built or `KERAS_IPU_NATIVE=0` turns it off; every caller then runs
its NumPy kernel, which computes the same bits."""

from keras_ipu.device.flags import env_switch

elementwise = None
if env_switch("KERAS_IPU_NATIVE"):
    try:
        from keras_ipu.device.native import _elementwise as elementwise
    except ImportError:
        elementwise = None


def available():
    """Whether the C kernels are in use."""
    return elementwise is not None
