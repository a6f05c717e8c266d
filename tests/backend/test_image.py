"""keras.ops.image on the ipu backend against NumPy / SciPy references,
and traced with unknown (None) dimensions."""

import colorsys

import keras
import numpy as np
import pytest
from scipy import ndimage

from keras_ipu.backend import core
from keras_ipu.backend import image as im

rng = np.random.default_rng(0)


def np_(x):
    return np.asarray(x)


# ------------------------------------------------------------------ colour
def test_rgb_to_grayscale_weights_both_layouts():
    x = rng.random((2, 4, 5, 3)).astype("float32")
    want = x @ np.array([0.2989, 0.5870, 0.1140], np.float32)
    out = np_(im.rgb_to_grayscale(x, data_format="channels_last"))
    np.testing.assert_allclose(out[..., 0], want, rtol=1e-6)
    first = np_(im.rgb_to_grayscale(np.moveaxis(x, -1, 1), data_format="channels_first"))
    np.testing.assert_allclose(first[:, 0], want, rtol=1e-6)


def test_hsv_matches_colorsys_and_round_trips():
    x = rng.random((6, 7, 3)).astype("float32")
    hsv = np_(im.rgb_to_hsv(x, data_format="channels_last"))
    want = np.array([colorsys.rgb_to_hsv(*p) for p in x.reshape(-1, 3)])
    np.testing.assert_allclose(hsv.reshape(-1, 3), want, atol=1e-5)
    back = np_(im.hsv_to_rgb(hsv, data_format="channels_last"))
    np.testing.assert_allclose(back, x, atol=1e-5)


def test_rgb_to_hsv_rejects_integers():
    with pytest.raises(ValueError, match="float"):
        im.rgb_to_hsv(np.ones((2, 2, 3), "int32"), data_format="channels_last")


# ------------------------------------------------------------------ resize
def _weights_1d(m, n, kernel, antialias):
    """Independent reference of the resampling weights (half-pixel
    centres, kernel widened by 1/scale when shrinking with antialias)."""
    scale = n / m
    ks = max(1 / scale, 1.0) if antialias else 1.0
    centres = (np.arange(n) + 0.5) / scale - 0.5
    w = kernel(np.abs(centres[None, :] - np.arange(m)[:, None]) / ks)
    return w / w.sum(0, keepdims=True)


def _triangle(x):
    return np.maximum(0, 1 - x)


def _keys(x):
    return np.where(
        x < 1, (1.5 * x - 2.5) * x * x + 1,
        np.where(x < 2, ((-0.5 * x + 2.5) * x - 4) * x + 2, 0),
    )


def _lanczos(r):
    def k(x):
        return np.where(x < r, np.sinc(x) * np.sinc(x / r), 0.0)

    return k


@pytest.mark.parametrize(
    "method,kernel",
    [("bilinear", _triangle), ("bicubic", _keys), ("lanczos3", _lanczos(3)),
     ("lanczos5", _lanczos(5))],
)
@pytest.mark.parametrize("antialias", [False, True])
@pytest.mark.parametrize("size", [(5, 13), (16, 4)])
def test_resize_is_separable_weights(method, kernel, antialias, size):
    x = rng.random((2, 9, 8, 3)).astype("float32")
    out = np_(im.resize(x, size, interpolation=method, antialias=antialias,
                        data_format="channels_last"))
    wh = _weights_1d(9, size[0], kernel, antialias)
    ww = _weights_1d(8, size[1], kernel, antialias)
    want = np.einsum("bhwc,hH,wW->bHWc", x, wh, ww)
    np.testing.assert_allclose(out, want, atol=1e-4)


def test_resize_bilinear_hand_values():
    x = np.array([[0.0, 10.0]], np.float32)[..., None]  # 1 x 2 image
    out = np_(im.resize(x, (1, 4), data_format="channels_last"))[0, :, 0]
    # Output centres at input x = -0.25, 0.25, 0.75, 1.25 (edges clamp).
    np.testing.assert_allclose(out, [0.0, 2.5, 7.5, 10.0])


def test_resize_nearest_and_area():
    x = np.arange(36, dtype="float32").reshape(6, 6, 1)
    near = np_(im.resize(x, (3, 2), interpolation="nearest", data_format="channels_last"))
    np.testing.assert_array_equal(near[..., 0], x[[1, 3, 5]][:, [1, 4], 0])
    area = np_(im.resize(x, (3, 2), interpolation="area", data_format="channels_last"))
    want = x[..., 0].reshape(3, 2, 2, 3).mean(axis=(1, 3))
    np.testing.assert_allclose(area[..., 0], want, rtol=1e-6)


def test_resize_integer_images_round_and_saturate():
    x = np.array([[0, 255, 0, 255]], np.uint8)[..., None]
    out = np_(im.resize(x, (1, 7), interpolation="bicubic", data_format="channels_last"))
    assert out.dtype == np.uint8 and out.min() >= 0 and out.max() <= 255


def test_resize_crop_and_pad_to_aspect_ratio():
    x = rng.random((4, 8, 1)).astype("float32")
    crop = np_(im.resize(x, (4, 4), crop_to_aspect_ratio=True, data_format="channels_last"))
    np.testing.assert_allclose(crop, x[:, 2:6], atol=1e-6)
    pad = np_(im.resize(x, (8, 8), pad_to_aspect_ratio=True, fill_value=-1.0,
                        data_format="channels_last", interpolation="nearest"))
    np.testing.assert_array_equal(pad[:2], -1.0)
    np.testing.assert_array_equal(pad[6:], -1.0)


def test_scale_and_translate_with_tensor_parameters():
    x = rng.random((10, 12, 2)).astype("float32")
    scale = keras.ops.convert_to_tensor(np.array([0.5, 2.0], np.float32))
    shift = keras.ops.convert_to_tensor(np.array([0.0, 0.0], np.float32))
    out = np_(im.scale_and_translate(x, (5, 24, 2), scale, shift, (0, 1), "linear",
                                     antialias=False))
    want = np_(im.resize(x, (5, 24), data_format="channels_last"))
    np.testing.assert_allclose(out, want, atol=1e-5)


# ---------------------------------------------------------- map_coordinates
@pytest.mark.parametrize("order", [0, 1])
@pytest.mark.parametrize("mode", ["constant", "nearest", "wrap", "mirror", "reflect"])
def test_map_coordinates_matches_scipy(order, mode):
    x = rng.random((5, 6)).astype("float32")
    coords = rng.uniform(-4, 9, size=(2, 7, 3)).astype("float32")
    out = np_(im.map_coordinates(x, coords, order, fill_mode=mode, fill_value=0.5))
    # SciPy is exact on an array padded wide enough in the same mode.
    pad = 12
    np_mode = {"nearest": "edge", "mirror": "reflect", "reflect": "symmetric"}.get(mode, mode)
    kwargs = {"constant_values": 0.5} if mode == "constant" else {}
    padded = np.pad(x.astype(np.float64), pad, mode=np_mode, **kwargs)
    want = ndimage.map_coordinates(padded, coords + pad, order=order, mode="nearest")
    np.testing.assert_allclose(out, want, atol=1e-5)


def test_map_coordinates_integer_input_rounds():
    x = np.array([0, 10, 20], np.int32)
    out = np_(im.map_coordinates(x, np.array([[0.26, 1.5]]), 1))
    np.testing.assert_array_equal(out, [3, 15])
    assert out.dtype == np.int32


# ------------------------------------------------------------- transforms
def test_affine_transform_identity_and_shift():
    x = rng.random((2, 6, 7, 3)).astype("float32")
    eye = np.array([1, 0, 0, 0, 1, 0, 0, 0], np.float32)
    np.testing.assert_allclose(np_(im.affine_transform(x, eye, data_format="channels_last")), x)
    shift = np.array([1, 0, 2, 0, 1, 1, 0, 0], np.float32)  # read x+2, y+1
    out = np_(im.affine_transform(x, shift, interpolation="nearest", data_format="channels_last"))
    np.testing.assert_allclose(out[:, :-1, :-2], x[:, 1:, 2:])
    np.testing.assert_array_equal(out[:, -1], 0)


def test_affine_transform_per_image_and_channels_first():
    x = rng.random((2, 3, 5, 5)).astype("float32")
    t = np.array([[1, 0, 0, 0, 1, 0, 0, 0], [1, 0, 1, 0, 1, 0, 0, 0]], np.float32)
    out = np_(im.affine_transform(x, t, data_format="channels_first", fill_mode="nearest"))
    np.testing.assert_allclose(out[0], x[0])
    np.testing.assert_allclose(out[1][..., :-1], x[1][..., 1:])
    np.testing.assert_allclose(out[1][..., -1], x[1][..., -1])


def test_perspective_transform_identity_and_homography():
    x = rng.random((5, 6, 2)).astype("float32")
    pts = np.array([[0, 0], [5, 0], [0, 4], [5, 4]], np.float32)
    out = np_(im.perspective_transform(x, pts, pts, data_format="channels_last"))
    np.testing.assert_allclose(out, x, atol=1e-5)
    h = np_(im.compute_homography_matrix(pts[None], pts[None] * 2))
    # End points map back onto start points: x_start = (a0 x + a1 y + a2) / k.
    for (sx, sy), (ex, ey) in zip(pts, pts * 2):
        k = h[0, 6] * ex + h[0, 7] * ey + 1
        np.testing.assert_allclose(
            [(h[0, 0] * ex + h[0, 1] * ey + h[0, 2]) / k,
             (h[0, 3] * ex + h[0, 4] * ey + h[0, 5]) / k], [sx, sy], atol=1e-4)


def test_elastic_transform_zero_alpha_is_identity_and_seeded():
    x = rng.random((8, 9, 2)).astype("float32")
    same = np_(im.elastic_transform(x, alpha=0.0, sigma=1.0, seed=1, data_format="channels_last"))
    np.testing.assert_allclose(same, x, atol=1e-6)
    a = np_(im.elastic_transform(x, alpha=3.0, sigma=1.0, seed=2, data_format="channels_last"))
    b = np_(im.elastic_transform(x, alpha=3.0, sigma=1.0, seed=2, data_format="channels_last"))
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a, x)


# ---------------------------------------------------------------- filters
@pytest.mark.parametrize("ksize,sigma", [((3, 3), (1.0, 1.0)), ((4, 6), (0.8, 1.5))])
def test_gaussian_blur_matches_scipy(ksize, sigma):
    x = rng.random((2, 11, 12, 3)).astype("float32")
    out = np_(im.gaussian_blur(x, ksize, sigma, data_format="channels_last"))

    def taps(size, s):
        t = np.exp(-0.5 * ((np.arange(size) - (size - 1) / 2) / s) ** 2)
        return t / t.sum()

    # First pair along the width, second along the height; zero padding
    # with the extra tap of an even kernel after the centre.
    kernel = np.outer(taps(ksize[1], sigma[1]), taps(ksize[0], sigma[0]))
    ph, pw = (ksize[1] - 1) // 2, (ksize[0] - 1) // 2
    padded = np.pad(x, ((0, 0), (ph, ksize[1] - 1 - ph), (pw, ksize[0] - 1 - pw), (0, 0)))
    want = np.zeros_like(x)
    for i in range(ksize[1]):
        for j in range(ksize[0]):
            want += kernel[i, j] * padded[:, i:i + 11, j:j + 12]
    np.testing.assert_allclose(out, want, atol=1e-5)


def test_sobel_edges_matches_scipy():
    x = rng.random((2, 7, 8, 3)).astype("float32")
    out = np_(im.sobel_edges(x, data_format="channels_last"))
    assert out.shape == (2, 7, 8, 3, 2)
    for axis in (0, 1):
        # ndimage.sobel would also smooth across batch and channels: build
        # the same filter from its two 1-D passes along H and W only.
        want = ndimage.correlate1d(x, [-1, 0, 1], axis=axis + 1, mode="reflect")
        want = ndimage.correlate1d(want, [1, 2, 1], axis=2 - axis, mode="reflect")
        np.testing.assert_allclose(out[..., axis], want, atol=1e-5)


# ---------------------------------------------------------------- tracing
CL = dict(data_format="channels_last")
EYE8 = np.eye(3).reshape(-1)[:8].astype("float32")


@pytest.mark.parametrize(
    "fn,shape",
    [
        (lambda t: im.resize(t, (5, 7), **CL), (None, 5, 7, 3)),
        (lambda t: im.resize(t, (5, 7), interpolation="nearest", **CL), (None, 5, 7, 3)),
        (lambda t: im.resize(t, (20, 7), pad_to_aspect_ratio=True, **CL), (None, 20, 7, 3)),
        (lambda t: im.rgb_to_grayscale(t, **CL), (None, 10, 12, 1)),
        (lambda t: im.rgb_to_hsv(t, **CL), (None, 10, 12, 3)),
        (lambda t: im.sobel_edges(t, **CL), (None, 10, 12, 3, 2)),
        (lambda t: im.gaussian_blur(t, (3, 3), (1.0, 1.0), **CL), (None, 10, 12, 3)),
        (lambda t: im.affine_transform(t, EYE8, **CL), (None, 10, 12, 3)),
        (lambda t: im.elastic_transform(t, seed=1, **CL), (None, 10, 12, 3)),
    ],
)
def test_traced_with_unknown_batch(fn, shape):
    spec = core.compute_output_spec(fn, keras.KerasTensor((None, 10, 12, 3)))
    assert tuple(spec.shape) == shape


def test_elastic_transform_sigma_tensor_and_traced_sigma():
    x = rng.random((1, 12, 10, 1)).astype("float32")
    sigma = keras.ops.convert_to_tensor(np.array([1.5], np.float32))
    a = np_(im.elastic_transform(x, alpha=2.0, sigma=sigma, seed=3, data_format="channels_last"))
    b = np_(im.elastic_transform(x, alpha=2.0, sigma=1.5, seed=3, data_format="channels_last"))
    np.testing.assert_allclose(a, b, atol=1e-6)
    spec = core.compute_output_spec(
        lambda t, s: im.elastic_transform(t, alpha=2.0, sigma=s, seed=3, **CL),
        keras.KerasTensor((None, 12, 10, 1)), keras.KerasTensor(()),
    )
    assert tuple(spec.shape) == (None, 12, 10, 1)
