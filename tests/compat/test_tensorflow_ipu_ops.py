"""IPU operators as TensorFlow functions (issue 12, item 4), compiled
through the TensorFlow front end and run on the simulated IPU; the numbers
of Keras' ops of the same name (ipu backend) where Keras has them."""

import numpy as np
import pytest

import keras

tf = pytest.importorskip("tensorflow")

import keras_ipu as ipu  # noqa: E402

X = np.random.default_rng(0).normal(size=(3, 5)).astype("float32") * 3


def on_ipu(fn, *args):
    out = ipu.ipu_compiler.compile(fn, inputs=[tf.constant(a) for a in args])
    return [o.numpy() for o in out]


@pytest.mark.parametrize("approximate", [True, False])
def test_gelu_matches_keras(approximate):
    (out,) = on_ipu(lambda x: ipu.nn_ops.gelu(x, approximate=approximate), X)
    expected = keras.ops.convert_to_numpy(keras.ops.gelu(X, approximate=approximate))
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)


def test_activations():
    swish, hard, soft, stable = on_ipu(
        lambda x: (ipu.nn_ops.swish(x), ipu.nn_ops.hard_sigmoid(x), ipu.nn_ops.softmax(x),
                   ipu.nn_ops.softmax(x, stable=True)), X)
    np.testing.assert_allclose(swish, keras.ops.convert_to_numpy(keras.ops.silu(X)),
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(hard, np.clip(0.2 * X + 0.5, 0, 1), rtol=1e-6)
    expected = keras.ops.convert_to_numpy(keras.ops.softmax(X, axis=-1))
    np.testing.assert_allclose(soft, expected, rtol=1e-5)
    np.testing.assert_allclose(stable, expected, rtol=1e-5)


def test_segment_sum_graphcore_example_and_checks():
    c = np.array([[1, 2, 3, 4], [4, 3, 2, 1], [5, 6, 7, 8]], "float32")
    (out,) = on_ipu(lambda d, s: ipu.math_ops.segment_sum(d, s, 2), c, np.array([0, 0, 1], "int32"))
    np.testing.assert_array_equal(out, [[5, 5, 5, 5], [5, 6, 7, 8]])
    with pytest.raises(ValueError, match="must be equal"):
        ipu.math_ops.segment_sum(c, tf.constant([0, 1]), 2)


def test_normalise_image_pads_a_fourth_channel():
    image = np.random.default_rng(1).integers(0, 256, (2, 4, 4, 3)).astype("uint8")
    offsets, scales = [0.5, 0.4, 0.3], [2.0, 3.0, 4.0]
    (out,) = on_ipu(lambda im: ipu.image_ops.normalise_image(im, offsets, scales, 1 / 255), image)
    assert out.shape == (2, 4, 4, 4) and out.dtype == np.float16
    expected = (image.astype("float32") / 255 - np.array(offsets)) * np.array(scales)
    np.testing.assert_allclose(out[..., :3], expected, rtol=2e-3, atol=2e-3)
    assert not out[..., 3].any()


def test_replication_index_is_each_replicas_own():
    from keras_ipu.frontends.tensorflow.function import bridge

    outfeed = ipu.ipu_outfeed_queue.IPUOutfeedQueue()

    def step():
        outfeed.enqueue(ipu.replication_ops.replication_index() * 10)

    bridge(step).run((), {}, replicas=2)
    np.testing.assert_array_equal(outfeed.dequeue().numpy(), [[0, 10]])
    (alone,) = on_ipu(lambda: ipu.replication_ops.replication_index())
    assert alone == 0
