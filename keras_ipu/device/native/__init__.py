"""keras_ipu's optional C kernels, built when the project is installed
(hatch_build.py). `elementwise` (fused elementwise chains), `scatter_add`
(row scatter-add), `pooling` (max pools and their gradients in one pass),
`im2col` (a 2-d convolution's patch copy), `rows` (sums and maxima
along the last axis: last_axis_reductions.py) and
`split_products` (the C thread pool of split
products: product_pool.py) are the extension modules, each None when it
was not built or `KERAS_IPU_NATIVE=0` turns them off; every caller then
runs its NumPy kernel (or the Python pool), which computes the same bits."""

import numpy as np

from keras_ipu.device.flags import env_switch

# The dtypes the C kernels (and the C pool's products) compute in; every
# other dtype runs its NumPy kernel.
FLOAT_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))

elementwise = None
scatter_add = None
pooling = None
im2col = None
rows = None
split_products = None
if env_switch("KERAS_IPU_NATIVE"):
    try:
        from keras_ipu.device.native import _elementwise as elementwise
    except ImportError:
        elementwise = None
    try:
        from keras_ipu.device.native import _scatter_add as scatter_add
    except ImportError:
        scatter_add = None
    try:
        from keras_ipu.device.native import _pooling as pooling
    except ImportError:
        pooling = None
    try:
        from keras_ipu.device.native import _im2col as im2col
    except ImportError:
        im2col = None
    try:
        from keras_ipu.device.native import _rows as rows
    except ImportError:
        rows = None
    try:
        from keras_ipu.device.native import _product_pool as split_products
    except ImportError:
        split_products = None


def available():
    """Whether the C kernels are in use (the fused chains' is the one the
    engine's speed depends on most)."""
    return elementwise is not None
