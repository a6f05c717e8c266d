"""Resampling at arbitrary coordinates: map_coordinates and the geometric
transforms built on it (affine, perspective, elastic).

Order 0 reads the nearest sample, order 1 blends the 2**rank neighbours
(multilinear); each neighbour's integer index is folded back into the array
by the fill mode (as scipy.ndimage on an edge-padded array): "constant"
reads fill_value outside, "nearest" clamps, "wrap" is periodic, "mirror"
reflects about the edge samples (d c b | a b c d | c b a), "reflect" about
the edges (c b a | a b c d | d c b). Reads are one `gather` per neighbour.
"""

import numpy as np

from keras.src import backend as kbackend

from keras_ipu.backend.image_ops import _build as b
from keras_ipu.device.array import Tensor
from keras_ipu.device.primitives import elementwise as ew
from keras_ipu.device.primitives.cumulative import cumsum_p
from keras_ipu.device.primitives.indexing import gather_p
from keras_ipu.device.primitives.structure import iota_p

FILL_MODES = ("constant", "nearest", "wrap", "mirror", "reflect")
AFFINE_TRANSFORM_INTERPOLATIONS = {"nearest": 0, "bilinear": 1}


def _fix_index(index, size, fill_mode):
    """(index folded into [0, size), in-range mask or None)."""
    if fill_mode == "constant":
        valid = ew.and_p.bind(
            b.compare(ew.ge_p, index, 0), b.compare(ew.lt_p, index, size)
        )
        return b.clip(index, 0, size - 1), valid
    if fill_mode == "nearest":
        return b.clip(index, 0, size - 1), None
    if fill_mode == "wrap":
        return b.mod(index, size), None
    if fill_mode == "mirror":
        if size == 1:
            return b.mul(index, 0), None
        period = 2 * (size - 1)
        folded = b.mod(index, period)
        return b.minimum(folded, b.sub(period, folded)), None
    # reflect
    period = 2 * size
    folded = b.mod(index, period)
    back = b.sub(period - 1, folded)
    return b.select(b.compare(ew.lt_p, folded, size), folded, back), None


def _neighbours(coordinate, order):
    """[(integer index (int32), weight)] of one coordinate array."""
    if order == 0:
        index = ew.floor_p.bind(b.add(coordinate, 0.5))
        return [(b.cast(index, np.int32), None)]
    lower = ew.floor_p.bind(coordinate)
    upper_weight = b.sub(coordinate, lower)
    lower_weight = b.sub(1.0, upper_weight)
    lower = b.cast(lower, np.int32)
    return [(lower, lower_weight), (b.add(lower, 1), upper_weight)]


def _sample(inputs, coordinates, sizes, order, fill_mode, fill_value,
            leading=None):
    """Interpolate `inputs` at `coordinates` (one float array per indexed
    leading axis of inputs, all of one shape S). `leading` is an optional
    exact integer index array for extra first axes (the batch). Returns
    S + inputs.shape[len(indexed axes):] in the coordinates' float dtype."""
    compute = coordinates[0].dtype
    per_axis = [_neighbours(c, order) for c in coordinates]
    trailing = len(inputs.shape) - len(coordinates) - (0 if leading is None else 1)
    values = b.cast(inputs, compute) if inputs.dtype != compute else inputs
    fill = np.asarray(fill_value, compute)
    total = None

    def corners(axis):
        if axis == len(per_axis):
            yield []
            return
        for rest in corners(axis + 1):
            for pair in per_axis[axis]:
                yield [pair] + rest

    for corner in corners(0):
        indices = [] if leading is None else [leading]
        weight = None
        valid = None
        for (index, w), size in zip(corner, sizes):
            fixed, ok = _fix_index(index, size, fill_mode)
            indices.append(fixed)
            if ok is not None:
                valid = ok if valid is None else ew.and_p.bind(valid, ok)
            if w is not None:
                weight = w if weight is None else b.mul(weight, w)
        stacked = b.stack(indices, -1)
        gathered = gather_p.bind(values, stacked, mode="clip")
        if valid is not None:
            valid = _trail(valid, trailing)
            gathered = b.select(valid, gathered, fill)
        if weight is not None:
            gathered = b.mul(gathered, _trail(weight, trailing))
        total = gathered if total is None else b.add(total, gathered)
    return total


def _trail(x, n):
    for _ in range(n):
        x = b.expand_dims(x, -1)
    return x


def _to_output(x, dtype):
    if dtype.kind in "iub":
        x = ew.round_p.bind(x)
        if dtype.kind == "u":
            x = b.maximum(x, 0.0)
        return b.cast(x, dtype)
    return b.cast(x, dtype)


def map_coordinates(
    inputs, coordinates, order, fill_mode="constant", fill_value=0.0
):
    inputs = b.tensor(inputs)
    if isinstance(coordinates, (list, tuple)):
        coords = [b.tensor(c) for c in coordinates]
    else:
        coordinates = b.tensor(coordinates)
        if len(coordinates.shape) < 2:
            raise ValueError(
                "Invalid coordinates rank: expected at least rank 2."
                f" Received input with shape: {coordinates.shape}"
            )
        coords = b.split_channels(coordinates, 0)
    if len(coords) != len(inputs.shape):
        raise ValueError(
            "First dim of `coordinates` must be the same as the rank of "
            "`inputs`. "
            f"Received inputs with shape: {inputs.shape} and coordinate "
            f"leading dim of {len(coords)}"
        )
    if fill_mode not in FILL_MODES:
        raise ValueError(
            "Invalid value for argument `fill_mode`. Expected one of "
            f"{set(FILL_MODES)}. Received: fill_mode={fill_mode}"
        )
    if order not in (0, 1):
        raise ValueError(
            "Invalid value for argument `order`. Expected one of "
            f"{[0, 1]}. Received: order={order}"
        )
    if any(d is None for d in inputs.shape):
        raise ValueError(
            f"map_coordinates needs the input's shape; got {inputs.shape} "
            "with unknown (None) dimensions."
        )
    compute = b.np_dtype(b.float_compute_dtype(b.kdtype(coords[0]), "float32"))
    coords = [b.cast(c, compute) for c in coords]
    out = _sample(inputs, coords, inputs.shape, order, fill_mode, fill_value)
    return _to_output(out, inputs.dtype)


def _grid(height, width, dtype):
    ys = iota_p.bind(dtype=np.dtype(dtype), shape=(height, width), dimension=0)
    xs = iota_p.bind(dtype=np.dtype(dtype), shape=(height, width), dimension=1)
    return ys, xs


def _column(transform, i):
    """transform[:, i] as (B, 1, 1)."""
    col = b.slice_axis(transform, 1, i, i + 1)
    return b.expand_dims(col, -1)


def _projective_sample(images, transform, order, fill_mode, fill_value):
    """images NHWC, transform (B or 1, 8): output (x, y) reads the input at
    ((a0 x + a1 y + a2) / k, (b0 x + b1 y + b2) / k), k = c0 x + c1 y + 1."""
    _, height, width, _ = images.shape
    if height is None or width is None:
        raise ValueError(
            "Geometric image transforms need the image height and width; "
            f"got shape {images.shape}."
        )
    dtype = transform.dtype
    ys, xs = _grid(height, width, dtype)
    a0, a1, a2, b0, b1, b2, c0, c1 = (_column(transform, i) for i in range(8))
    k = b.add(b.add(b.mul(c0, xs), b.mul(c1, ys)), 1.0)
    x_in = b.div(b.add(b.add(b.mul(a0, xs), b.mul(a1, ys)), a2), k)
    y_in = b.div(b.add(b.add(b.mul(b0, xs), b.mul(b1, ys)), b2), k)
    return _sample_batched(images, y_in, x_in, order, fill_mode, fill_value)


def _sample_batched(images, y_in, x_in, order, fill_mode, fill_value):
    """images NHWC; y_in, x_in (B or 1, H, W) -> (B, H, W, C)."""
    batch, height, width, _ = images.shape
    shape = (batch, height, width)
    if batch is not None:
        zeros = np.zeros(shape, y_in.dtype)
        leading = iota_p.bind(dtype=np.dtype(np.int32), shape=shape, dimension=0)
    else:
        # Batch unknown while traced: derive the batch index from the
        # images themselves (a running count of ones along the batch).
        plane = b.squeeze(b.slice_axis(images, 3, 0, 1), 3)
        ones = b.cast(
            ew.or_p.bind(ew.eq_p.bind(plane, plane), ew.ne_p.bind(plane, plane)),
            np.int32,
        )
        leading = b.sub(cumsum_p.bind(ones, axis=0), 1)
        zeros = b.mul(b.cast(ones, y_in.dtype), 0.0)
    y_in = b.add(y_in, zeros)
    x_in = b.add(x_in, zeros)
    return _sample(
        images, [y_in, x_in], (height, width), order, fill_mode, fill_value,
        leading=leading,
    )


def _to_nhwc(images, data_format):
    need_squeeze = len(images.shape) == 3
    if need_squeeze:
        images = b.expand_dims(images, 0)
    if data_format == "channels_first":
        images = b.transpose(images, (0, 2, 3, 1))
    return images, need_squeeze


def _from_nhwc(images, data_format, need_squeeze):
    if data_format == "channels_first":
        images = b.transpose(images, (0, 3, 1, 2))
    if need_squeeze:
        images = b.squeeze(images, 0)
    return images


def _check_fill_mode(fill_mode):
    # Keras' other backends word it so ("Expected of one").
    if fill_mode not in FILL_MODES:
        raise ValueError(
            "Invalid value for argument `fill_mode`. Expected of one "
            f"{set(FILL_MODES)}. Received: fill_mode={fill_mode}"
        )


def _check_interpolation(interpolation):
    if interpolation not in AFFINE_TRANSFORM_INTERPOLATIONS:
        raise ValueError(
            "Invalid value for argument `interpolation`. Expected of one "
            f"{set(AFFINE_TRANSFORM_INTERPOLATIONS)}. Received: "
            f"interpolation={interpolation}"
        )


def affine_transform(
    images,
    transform,
    interpolation="bilinear",
    fill_mode="constant",
    fill_value=0,
    data_format=None,
):
    data_format = kbackend.standardize_data_format(data_format)
    _check_interpolation(interpolation)
    _check_fill_mode(fill_mode)
    images = b.tensor(images)
    transform = b.tensor(transform)
    b.check_images_rank(images)
    if len(transform.shape) not in (1, 2):
        raise ValueError(
            "Invalid transform rank: expected rank 1 (single transform) "
            "or rank 2 (batch of transforms). Received input with shape: "
            f"transform.shape={transform.shape}"
        )
    input_dtype = images.dtype
    compute = b.np_dtype(b.float_compute_dtype(b.kdtype(images), "float32"))
    transform = b.cast(transform, compute)
    if len(transform.shape) == 1:
        transform = b.expand_dims(transform, 0)
    images, need_squeeze = _to_nhwc(images, data_format)
    out = _projective_sample(
        images, transform, AFFINE_TRANSFORM_INTERPOLATIONS[interpolation],
        fill_mode, fill_value,
    )
    out = _from_nhwc(out, data_format, need_squeeze)
    return _to_output(out, input_dtype)


def compute_homography_matrix(start_points, end_points):
    """The 8 projective coefficients mapping end points to start points,
    from the 8x8 linear system of the four correspondences."""
    from keras.src.backend.common import dtypes

    from keras_ipu.backend import linalg

    start_points = b.tensor(start_points)
    end_points = b.tensor(end_points)
    dtype = dtypes.result_type(b.kdtype(start_points), b.kdtype(end_points), float)
    compute = b.np_dtype(dtypes.result_type(dtype, "float32"))
    start = b.cast(start_points, compute)
    end = b.cast(end_points, compute)

    def coord(points, i, j):
        p = b.slice_axis(b.slice_axis(points, 1, i, i + 1), 2, j, j + 1)
        return b.squeeze(b.squeeze(p, 2), 1)

    zero = None
    rows = []
    targets = []
    for i in range(4):
        ex, ey = coord(end, i, 0), coord(end, i, 1)
        sx, sy = coord(start, i, 0), coord(start, i, 1)
        zero = b.mul(ex, 0.0)
        one = b.add(zero, 1.0)
        rows.append([ex, ey, one, zero, zero, zero,
                     b.mul(b.mul(sx, ex), -1.0), b.mul(b.mul(sx, ey), -1.0)])
        rows.append([zero, zero, zero, ex, ey, one,
                     b.mul(b.mul(sy, ex), -1.0), b.mul(b.mul(sy, ey), -1.0)])
        targets += [sx, sy]
    matrix = b.stack([b.stack(r, -1) for r in rows], 1)
    target = b.expand_dims(b.stack(targets, -1), -1)
    solution = linalg.solve(matrix, target)
    solution = b.reshape(solution, (solution.shape[0], 8))
    return b.cast(solution, dtype)


def perspective_transform(
    images,
    start_points,
    end_points,
    interpolation="bilinear",
    fill_value=0,
    data_format=None,
):
    data_format = kbackend.standardize_data_format(data_format)
    _check_interpolation(interpolation)
    images = b.tensor(images)
    start_points = b.tensor(start_points)
    end_points = b.tensor(end_points)
    b.check_images_rank(images)
    for name, points in (("start_points", start_points), ("end_points", end_points)):
        if len(points.shape) not in (2, 3) or tuple(points.shape[-2:]) != (4, 2):
            raise ValueError(
                f"Invalid {name} shape: expected (4,2) for a single image"
                f" or (N,4,2) for a batch. Received shape: {points.shape}"
            )
    if tuple(start_points.shape) != tuple(end_points.shape):
        raise ValueError(
            "start_points and end_points must have the same shape."
            f" Received start_points.shape={start_points.shape}, "
            f"end_points.shape={end_points.shape}"
        )
    input_dtype = images.dtype
    if len(start_points.shape) == 2:
        start_points = b.expand_dims(start_points, 0)
        end_points = b.expand_dims(end_points, 0)
    compute = b.np_dtype(b.float_compute_dtype(b.kdtype(images), "float32"))
    transform = b.cast(compute_homography_matrix(start_points, end_points), compute)
    images, need_squeeze = _to_nhwc(images, data_format)
    out = _projective_sample(
        images, transform, AFFINE_TRANSFORM_INTERPOLATIONS[interpolation],
        "constant", fill_value,
    )
    out = _from_nhwc(out, data_format, need_squeeze)
    return _to_output(out, input_dtype)


def _elastic_kernel_size(sigma, height, width):
    """int(6 sigma) | 1 taps, as Keras' other backends. A traced sigma has
    no value to size the kernel by: the kernel then spans the whole image
    (the taps beyond 3 sigma are negligible, so the blur is the same)."""
    if b.is_array(sigma) and not isinstance(sigma, Tensor):
        return (2 * max(height, width) - 1) | 1
    if isinstance(sigma, Tensor):
        sigma = float(np.asarray(sigma._value).reshape(()))
    return int(6 * float(sigma)) | 1


def elastic_transform(
    images,
    alpha=20.0,
    sigma=5.0,
    interpolation="bilinear",
    fill_mode="reflect",
    fill_value=0.0,
    seed=None,
    data_format=None,
):
    """Displace each pixel by alpha * (Gaussian-blurred N(0, sigma) noise),
    one field for y and one for x, then resample."""
    from keras_ipu.backend import random
    from keras_ipu.backend.image_ops.filters import blur_nhwc

    data_format = kbackend.standardize_data_format(data_format)
    _check_interpolation(interpolation)
    _check_fill_mode(fill_mode)
    images = b.tensor(images)
    b.check_images_rank(images)
    input_dtype = images.dtype
    compute = b.np_dtype(b.float_compute_dtype(b.kdtype(images), "float32"))
    images, need_squeeze = _to_nhwc(images, data_format)
    batch, height, width, _ = images.shape
    if height is None or width is None:
        raise ValueError(
            "elastic_transform needs the image height and width; got shape "
            f"{images.shape}."
        )
    size = _elastic_kernel_size(sigma, height, width)
    sigma = b.cast(sigma, compute)
    key = random._key(seed)
    noise = random.normal((2, batch, height, width, 1), dtype=compute, seed=key)
    noise = b.mul(b.reshape(noise, (-1, height, width, 1)), sigma)
    field = blur_nhwc(noise, (size, size), (sigma, sigma))
    field = b.reshape(field, (2, -1, height, width))
    field = b.mul(field, b.cast(alpha, compute))
    dx = b.squeeze(b.slice_axis(field, 0, 0, 1), 0)
    dy = b.squeeze(b.slice_axis(field, 0, 1, 2), 0)
    ys, xs = _grid(height, width, compute)
    out = _sample_batched(
        images, b.add(ys, dy), b.add(xs, dx),
        AFFINE_TRANSFORM_INTERPOLATIONS[interpolation], fill_mode, fill_value,
    )
    out = _from_nhwc(out, data_format, need_squeeze)
    return _to_output(out, input_dtype)
