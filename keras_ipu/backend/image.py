"""Keras backend `image` ops for the ipu backend.

Built from device primitives; the ops live in keras_ipu/backend/image_ops/
by kind: colour conversions, resizing (separable weight matrices),
resampling at coordinates (gathers), and filters (depthwise convolutions).
"""

from keras_ipu.backend.image_ops.color import hsv_to_rgb  # noqa: F401
from keras_ipu.backend.image_ops.color import rgb_to_grayscale  # noqa: F401
from keras_ipu.backend.image_ops.color import rgb_to_hsv  # noqa: F401
from keras_ipu.backend.image_ops.filters import gaussian_blur  # noqa: F401
from keras_ipu.backend.image_ops.filters import sobel_edges  # noqa: F401
from keras_ipu.backend.image_ops.resize import RESIZE_INTERPOLATIONS  # noqa: F401
from keras_ipu.backend.image_ops.resize import resize  # noqa: F401
from keras_ipu.backend.image_ops.resize import scale_and_translate  # noqa: F401
from keras_ipu.backend.image_ops.sampling import affine_transform  # noqa: F401
from keras_ipu.backend.image_ops.sampling import (  # noqa: F401
    compute_homography_matrix,
)
from keras_ipu.backend.image_ops.sampling import elastic_transform  # noqa: F401
from keras_ipu.backend.image_ops.sampling import map_coordinates  # noqa: F401
from keras_ipu.backend.image_ops.sampling import (  # noqa: F401
    perspective_transform,
)
