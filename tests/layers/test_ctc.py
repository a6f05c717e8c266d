"""CTC layers on time-major data: the loss is keras.ops.ctc_loss's mean,
the beam search finds the most probable labelings (checked by enumerating
every alignment of a small problem)."""

import itertools

import keras
import numpy as np
import pytest

from keras_ipu import layers
from layer_checks import config_round_trip

RNG = np.random.default_rng(0)
TIME, BATCH, CLASSES = 4, 3, 3
LOGITS = RNG.normal(size=(TIME, BATCH, CLASSES)).astype("float32") * 2
LOG_PROBS = LOGITS - np.log(np.exp(LOGITS).sum(-1, keepdims=True))
DATA_LENGTH = np.array([4, 3, 4], "int32")
LABELS = np.array([[1, 2], [2, 0], [1, 1]], "int32")
LABEL_LENGTH = np.array([2, 1, 2], "int32")


def _collapse(alignment, blank):
    out = []
    for k, c in enumerate(alignment):
        if c != blank and (k == 0 or c != alignment[k - 1]):
            out.append(c)
    return tuple(out)


def _labeling_log_probs(log_probs, length, blank):
    """log P(labeling) for every labeling, by summing all alignments."""
    totals = {}
    for alignment in itertools.product(range(CLASSES), repeat=length):
        p = np.exp(sum(log_probs[t, c] for t, c in enumerate(alignment)))
        key = _collapse(alignment, blank)
        totals[key] = totals.get(key, 0.0) + p
    return {k: np.log(v) for k, v in totals.items()}


@pytest.mark.parametrize("from_logits", [True, False])
def test_loss_is_the_mean_ctc_loss(from_logits):
    data = LOGITS if from_logits else LOG_PROBS
    loss = layers.CTCLoss(blank_index=0, from_logits=from_logits)(
        LABELS, data, LABEL_LENGTH, DATA_LENGTH)
    want = keras.ops.ctc_loss(LABELS, np.swapaxes(LOGITS, 0, 1), LABEL_LENGTH,
                              DATA_LENGTH, mask_index=0)
    assert tuple(loss.shape) == (1,)
    np.testing.assert_allclose(np.asarray(loss), [np.mean(np.asarray(want))], rtol=1e-5)
    # And by enumeration: -log P(labels) of the first sequence.
    exact = _labeling_log_probs(LOG_PROBS[:, 0], 4, 0)[(1, 2)]
    np.testing.assert_allclose(np.asarray(want)[0], -exact, rtol=1e-5)


@pytest.mark.parametrize("blank", [0, 2])
def test_beam_search_finds_the_most_probable_labelings(blank):
    layer = layers.CTCInferenceLayer(blank_index=blank, beam_width=16, top_paths=3)
    probs, lengths, labels = (np.asarray(t) for t in layer(LOG_PROBS, DATA_LENGTH))
    assert probs.shape == lengths.shape == (BATCH, 3)
    assert labels.shape == (BATCH, 3, TIME)
    for b in range(BATCH):
        exact = _labeling_log_probs(LOG_PROBS[:, b], DATA_LENGTH[b], blank)
        best = sorted(exact.items(), key=lambda kv: -kv[1])[:3]
        for k, (labeling, log_p) in enumerate(best):
            assert lengths[b, k] == len(labeling)
            assert tuple(labels[b, k, :lengths[b, k]]) == labeling
            assert (labels[b, k, lengths[b, k]:] == blank).all()
            np.testing.assert_allclose(probs[b, k], -log_p, rtol=1e-5)
    from_logits = layers.CTCInferenceLayer(blank_index=blank, beam_width=16,
                                           top_paths=3, from_logits=True)
    np.testing.assert_array_equal(np.asarray(from_logits(LOGITS, DATA_LENGTH)[2]), labels)


def test_predictions_are_the_best_path_padded_with_blank():
    top = layers.CTCInferenceLayer(blank_index=0, beam_width=16, top_paths=2)
    probs, lengths, labels = (np.asarray(t) for t in top(LOG_PROBS, DATA_LENGTH))
    got = np.asarray(layers.CTCPredictionsLayer(blank_index=0, beam_width=16,
                                                top_paths=2)(LOG_PROBS, DATA_LENGTH))
    assert got.shape == (BATCH, TIME)
    for b in range(BATCH):
        k = int(np.argmin(probs[b]))
        want = np.where(np.arange(TIME) < lengths[b, k], labels[b, k], 0)
        np.testing.assert_array_equal(got[b], want)


def test_errors_and_config():
    with pytest.raises(ValueError, match=r"top_paths \(4\) must be less than or equal "
                       r"to beam_width \(2\)"):
        layers.CTCInferenceLayer(beam_width=2, top_paths=4)(LOG_PROBS, DATA_LENGTH)
    for layer in (layers.CTCLoss(blank_index=2, from_logits=True),
                  layers.CTCInferenceLayer(blank_index=1, beam_width=5, top_paths=2),
                  layers.CTCPredictionsLayer(blank_index=1, beam_width=5)):
        config_round_trip(layer)


def test_graphcore_usage_trains_compiled_and_saves(tmp_path):
    # The usage example of Graphcore's CTCLoss docstring.
    labels = keras.Input((2,), batch_size=BATCH, dtype="int32", name="labels")
    data = keras.Input((TIME, 5), batch_size=BATCH, name="data")
    label_length = keras.Input((), batch_size=BATCH, dtype="int32", name="label_length")
    logit_length = keras.Input((), batch_size=BATCH, dtype="int32", name="logit_length")
    x = keras.layers.Dense(CLASSES)(data)
    x = keras.layers.Lambda(lambda t: keras.ops.transpose(t, (1, 0, 2)))(x)
    loss = layers.CTCLoss(from_logits=True)(labels, x, label_length, logit_length)
    model = keras.Model((labels, data, label_length, logit_length), loss)
    model.compile("sgd", loss=lambda y_true, y_pred: y_pred)
    inputs = (LABELS, RNG.normal(size=(BATCH, TIME, 5)).astype("float32"),
              LABEL_LENGTH, DATA_LENGTH)
    history = model.fit(inputs, np.zeros((BATCH, 1), "float32"), batch_size=BATCH,
                        epochs=3, verbose=0)
    losses = history.history["loss"]
    assert losses[-1] < losses[0]


def test_save_and_load(tmp_path):
    # Time-major inputs straight in: keras.Input's leading axis is time.
    data = keras.Input((BATCH, CLASSES), batch_size=TIME)
    length = keras.Input((), batch_size=BATCH, dtype="int32")
    labels = keras.Input((2,), batch_size=BATCH, dtype="int32")
    label_length = keras.Input((), batch_size=BATCH, dtype="int32")
    outputs = [
        layers.CTCPredictionsLayer(beam_width=8)(data, length),
        *layers.CTCInferenceLayer(beam_width=8, top_paths=2)(data, length),
        layers.CTCLoss()(labels, data, label_length, length),
    ]
    model = keras.Model((data, length, labels, label_length), outputs)
    path = tmp_path / "ctc.keras"
    model.save(path)
    loaded = keras.saving.load_model(path)
    inputs = (LOG_PROBS, DATA_LENGTH, LABELS, LABEL_LENGTH)
    for got, want in zip(loaded(inputs), model(inputs)):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
