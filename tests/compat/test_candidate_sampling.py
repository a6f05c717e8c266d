"""The default candidate sampler of nn_ops.nce_loss / sampled_softmax_loss
inside compiled functions (issue 12): TensorFlow's log-uniform sampler as a
device primitive carried through an XLA custom call."""

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

import keras_ipu as ipu  # noqa: E402
from keras_ipu.device.primitives import candidate_sampling as device_sampler  # noqa: E402
from keras_ipu.ops import candidate_sampling  # noqa: E402

RANGE = 50


def on_ipu(fn, *args, seed=None):
    if seed is not None:
        ipu.utils.reset_ipu_seed(seed)
    out = ipu.ipu_compiler.compile(fn, inputs=[tf.constant(a) for a in args])
    return [o.numpy() for o in out]


def sample(labels, num_sampled, unique, seed, range_max=RANGE):
    return on_ipu(lambda t: candidate_sampling.log_uniform_candidate_sampler(
        t, labels.shape[1], num_sampled, unique, range_max), labels, seed=seed)


def test_draws_follow_the_log_uniform_distribution():
    labels = np.array([[0], [3], [49]], "int64")
    sampled, true_expected, sampled_expected = sample(labels, 4000, False, seed=1234)
    assert sampled.dtype == np.int64 and sampled.shape == (4000,)
    assert sampled.min() >= 0 and sampled.max() < RANGE
    p = np.log((np.arange(RANGE) + 2.0) / (np.arange(RANGE) + 1.0)) / np.log(RANGE + 1.0)
    # Pearson's chi-square over the classes, the tail pooled so that each
    # bin expects at least 40 draws; the test fails below p = 0.001 (a
    # uniform sampler's statistic is in the thousands).
    counts = np.bincount(sampled, minlength=RANGE)
    edges = [0, 1, 2, 3, 4, 5, 6, 8, 10, 13, 17, 22, 29, 38, RANGE]
    observed = np.add.reduceat(counts, edges[:-1])
    expected = 4000 * np.add.reduceat(p, edges[:-1])
    assert expected.min() >= 40
    statistic = ((observed - expected) ** 2 / expected).sum()
    from scipy import stats

    assert stats.chi2.sf(statistic, len(edges) - 2) > 1e-3, statistic
    # Without rejections a class's expected count is P * num_sampled, as
    # TensorFlow's own sampler gives it.
    tf_true = tf.random.log_uniform_candidate_sampler(labels, 1, 4000, False, RANGE)[1]
    np.testing.assert_allclose(true_expected, tf_true.numpy(), rtol=1e-6)
    np.testing.assert_allclose(sampled_expected, 4000 * p[sampled], rtol=1e-5)


def test_a_seed_fixes_the_draws_and_unique_draws_are_distinct():
    labels = np.array([[1, 2], [7, 30]], "int64")
    first = sample(labels, 20, True, seed=7)
    again = sample(labels, 20, True, seed=7)
    other = sample(labels, 20, True, seed=8)
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(first[0], other[0])
    sampled, true_expected, sampled_expected = first
    assert len(set(sampled.tolist())) == 20 and true_expected.shape == (2, 2)
    # TensorFlow's expected counts with rejections: 1 - (1 - P)^tries for
    # the one number of tries the sample took (at least 20).
    p_sampled = device_sampler.log_uniform_probability(sampled, RANGE)
    tries = np.round(np.log1p(-sampled_expected) / np.log1p(-p_sampled))
    assert len(set(tries.tolist())) == 1 and tries[0] > 20
    n = int(tries[0])
    np.testing.assert_allclose(
        true_expected, -np.expm1(n * np.log1p(-device_sampler.log_uniform_probability(
            labels, RANGE))), rtol=1e-5)
    with pytest.raises(ValueError, match="Sampler's range is too small"):
        sample(labels, 20, True, seed=7, range_max=10)


@pytest.mark.parametrize("loss", ["nce_loss", "sampled_softmax_loss"])
def test_sampled_losses_sample_on_the_device_and_match_tensorflow(loss):
    rng = np.random.default_rng(11)
    num_classes, dim, batch, num_sampled = 40, 6, 5, 8
    weights = rng.normal(size=(num_classes, dim)).astype("float32")
    biases = rng.normal(size=(num_classes,)).astype("float32")
    inputs = rng.normal(size=(batch, dim)).astype("float32")
    labels = rng.integers(0, num_classes, size=(batch, 1)).astype("int64")
    fn = getattr(ipu.nn_ops, loss)

    def loss_and_gradient(w, b, x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            out = fn(w, b, labels, x, num_sampled, num_classes)
            total = tf.reduce_sum(out)
        return out, tape.gradient(total, x)

    # The same seed gives the loss's sampler the draws the sampler alone makes.
    drawn = sample(labels, num_sampled, True, seed=99, range_max=num_classes)
    out, grad = on_ipu(loss_and_gradient, weights, biases, inputs, seed=99)
    with tf.GradientTape() as tape:
        x = tf.constant(inputs)
        tape.watch(x)
        expected = getattr(tf.nn, loss)(weights, biases, labels, x, num_sampled, num_classes,
                                        sampled_values=tuple(tf.constant(d) for d in drawn),
                                        remove_accidental_hits=False)
        total = tf.reduce_sum(expected)
    np.testing.assert_allclose(out, expected.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(grad, tape.gradient(total, x).numpy(),
                               rtol=1e-5, atol=1e-6)
    # Outside a compiled function the sampler is TensorFlow's own.
    eager = fn(weights, biases, labels, inputs, num_sampled, num_classes)
    assert eager.shape == (batch,)
