"""Graphcore's CTC beam-search decoders (nn_ops, issue 12 item 4) compiled
through the TensorFlow front end, against TensorFlow's own decoder
(tf.nn.ctc_beam_search_decoder, run eagerly on the host: it has no XLA
kernel) on small cases."""

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

import keras_ipu as ipu  # noqa: E402

TIME, BATCH, CLASSES = 7, 3, 5
LOGITS = np.random.default_rng(3).normal(size=(TIME, BATCH, CLASSES)).astype("float32") * 2
LENGTHS = np.array([7, 5, 3], "int32")


def _tensorflow_decoder(logits, top_paths, beam_width):
    """TensorFlow's paths (lists of labels) and log probabilities, blank =
    the last class (TensorFlow's only choice)."""
    decoded, log_probs = tf.nn.ctc_beam_search_decoder(
        tf.constant(logits), tf.constant(LENGTHS), beam_width=beam_width, top_paths=top_paths)
    paths = []
    for sparse in decoded:
        dense = tf.sparse.to_dense(sparse, default_value=-1).numpy()
        paths.append([[int(v) for v in row if v >= 0] for row in dense])
    return paths, log_probs.numpy()


@pytest.mark.parametrize("top_paths, beam_width", [(1, 1), (1, 16), (3, 16), (3, 64)])
def test_decoder_matches_tensorflows(top_paths, beam_width):
    """Paths and log probabilities equal TensorFlow's where both searches
    keep every prefix that matters (here a beam of 16 or more; beam 1 is
    the greedy path of both)."""
    probs, lengths, labels = ipu.ipu_compiler.compile(
        lambda x, n: ipu.nn_ops.ctc_beam_search_decoder(
            x, n, beam_width=beam_width, top_paths=top_paths),
        inputs=[tf.constant(LOGITS), tf.constant(LENGTHS)])
    probs, lengths, labels = probs.numpy(), lengths.numpy(), labels.numpy()
    assert probs.shape == lengths.shape == (BATCH, top_paths)
    assert labels.shape == (BATCH, top_paths, TIME) and labels.dtype == np.int32
    paths, log_probs = _tensorflow_decoder(LOGITS, top_paths, beam_width)
    np.testing.assert_allclose(-probs, log_probs, rtol=1e-4, atol=1e-5)
    for b in range(BATCH):
        for k in range(top_paths):
            n = lengths[b, k]
            assert list(labels[b, k, :n]) == paths[k][b]
            assert (labels[b, k, n:] == CLASSES - 1).all()


def test_a_narrow_beam_finds_tensorflows_best_paths():
    """With a beam of 4 the two searches prune differently, so their
    probability estimates differ (by up to 0.7 here); the best paths agree."""
    _, lengths, labels = ipu.ipu_compiler.compile(
        lambda x, n: ipu.nn_ops.ctc_beam_search_decoder(x, n, beam_width=4),
        inputs=[tf.constant(LOGITS), tf.constant(LENGTHS)])
    paths, _ = _tensorflow_decoder(LOGITS, 1, 4)
    for b in range(BATCH):
        assert list(labels.numpy()[b, 0, :lengths.numpy()[b, 0]]) == paths[0][b]


def test_log_probs_variant_and_a_first_class_blank():
    """With log probabilities the same search; with blank_index=0 the
    labels are TensorFlow's on the classes rolled so that 0 is last."""
    log_probs = tf.nn.log_softmax(LOGITS).numpy()
    got = ipu.ipu_compiler.compile(
        lambda x, n: (ipu.nn_ops.ctc_beam_search_decoder_with_log_probs(x, n, 16, 2),
                      ipu.nn_ops.ctc_beam_search_decoder(x, n, 16, 2, blank_index=0)),
        inputs=[tf.constant(log_probs), tf.constant(LENGTHS)])
    (probs, lengths, labels), (probs0, lengths0, labels0) = [[t.numpy() for t in g] for g in got]
    paths, want = _tensorflow_decoder(log_probs, 2, 16)
    np.testing.assert_allclose(-probs, want, rtol=1e-4, atol=1e-5)
    rolled, want0 = _tensorflow_decoder(np.roll(log_probs, -1, axis=-1), 2, 16)
    np.testing.assert_allclose(-probs0, want0, rtol=1e-4, atol=1e-5)
    for b in range(BATCH):
        for k in range(2):
            assert list(labels0[b, k, :lengths0[b, k]]) == [c + 1 for c in rolled[k][b]]


def test_decoder_checks():
    with pytest.raises(ValueError, match=r"top_paths \(4\) must be less than or equal to "
                                         r"beam_width \(2\)"):
        ipu.nn_ops.ctc_beam_search_decoder(LOGITS, LENGTHS, beam_width=2, top_paths=4)
    with pytest.raises(ValueError, match="blank_index=5"):
        ipu.nn_ops.ctc_beam_search_decoder(LOGITS, LENGTHS, blank_index=5)
