"""Connectionist temporal classification: loss and decoding.

ctc_loss runs the CTC forward algorithm in log space over the
blank-interleaved label sequence (length 2L+1), vectorised over the batch,
one step per time step. Greedy decoding is array ops; beam search is the
ctc_beam_search primitive.
"""

import numpy as np

from keras.src.backend.common import dtypes

from keras_ipu.backend.nn_ops import _lax as lax
from keras_ipu.backend.nn_ops.normalization import log_softmax
from keras_ipu.device.primitives.ctc import ctc_beam_search_p
from keras_ipu.device.primitives.pooling import reduce_window

__all__ = ["ctc_loss", "ctc_decode"]

# log(0) stand-in, as optax/Keras use: finite, so impossible transitions
# stay finite (and differentiable) instead of producing inf - inf.
_LOG_EPSILON = -1e5


def _shift_right(x, k):
    """x shifted k places along its last axis; vacated places hold the
    max-identity (-inf, or the integer minimum). A window-1 reduce_window
    with (k, -k) padding is exactly that pad-and-crop."""
    pads = ((0, 0),) * (x.ndim - 1) + ((k, -k),)
    return reduce_window(x, "max", (1,) * x.ndim, None, pads)


def _pick(x, index_mask):
    """x[b, s] at the one s where index_mask[b, s] (else -inf)."""
    return lax.reduce_max(lax.select(index_mask, x, -np.inf), -1)


def ctc_loss(target, output, target_length, output_length, mask_index=0):
    target = lax.cast(lax.tensor(target), "int32")
    output = lax.tensor(output)
    dtype = dtypes.result_type(lax.kdtype(output), "float32")
    output = lax.cast(output, dtype)
    target_length = lax.cast(lax.tensor(target_length), "int32")
    output_length = lax.cast(lax.tensor(output_length), "int32")
    _, steps, classes = output.shape
    max_labels = target.shape[1]
    if steps is None or max_labels is None or classes is None:
        raise ValueError(
            "ctc_loss loops over time, so the time, label and class sizes "
            f"must be known; got output.shape={output.shape}, "
            f"target.shape={target.shape}."
        )
    log_probs = log_softmax(output, axis=-1)

    # Extended labels: blank, l1, blank, l2, ..., lL, blank.
    size = 2 * max_labels + 1
    spread = np.zeros((max_labels, size), np.int32)
    spread[np.arange(max_labels), 2 * np.arange(max_labels) + 1] = 1
    labels_at = lax.reduce_sum(lax.mul(lax.expand_dims(target, -1), spread), 1)
    odd = (np.arange(size) % 2 == 1)
    ext = lax.select(odd, labels_at, np.int32(mask_index))
    # A label may follow the previous label directly (skipping the blank
    # between them) unless both are the same label.
    can_skip = lax.logical_and(odd, lax.ne(ext, _shift_right(ext, 2)))
    ext_hot = lax.eq(lax.expand_dims(ext, -1), np.arange(classes, dtype=np.int32))

    neg = lax.scalar(_LOG_EPSILON, log_probs)
    first = np.arange(size) == 0
    alpha = lax.select(
        first, lax.scalar(0.0, log_probs),
        lax.broadcast_to(neg, (target.shape[0], size)),
    )
    for t in range(steps):
        lp_t = lax.expand_dims(log_probs[:, t, :], 1)  # (B, 1, C)
        emit = _pick(lp_t, ext_hot)  # (B, S)
        stay = alpha
        step = lax.maximum(_shift_right(alpha, 1), neg)
        skip = lax.select(can_skip, lax.maximum(_shift_right(alpha, 2), neg), neg)
        new = lax.add(lax.logaddexp(lax.logaddexp(stay, step), skip), emit)
        live = lax.expand_dims(lax.lt(np.int32(t), output_length), -1)
        alpha = lax.select(live, new, alpha)

    positions = np.arange(size, dtype=np.int32)
    end = lax.expand_dims(lax.mul(target_length, 2), -1)
    last_blank = _pick(alpha, lax.eq(positions, end))
    last_label = _pick(alpha, lax.eq(positions, lax.sub(end, 1)))
    return lax.neg(lax.logaddexp(last_blank, last_label))


def _greedy(inputs, lengths, merge_repeated, mask_index):
    from keras_ipu.backend import numpy as knp

    steps = inputs.shape[1]
    best = lax.argmax(inputs, -1)
    scores = lax.reduce_max(inputs, -1)
    time = np.arange(steps, dtype=np.int32)
    past_end = lax.ge(time, lax.expand_dims(lengths, -1))
    blank = np.int32(mask_index)
    best = lax.select(past_end, blank, best)
    scores = lax.select(past_end, lax.scalar(0, scores), scores)
    if merge_repeated:
        best = lax.select(lax.eq(best, _shift_right(best, 1)), blank, best)
    dropped = lax.eq(best, blank)
    best = lax.select(dropped, np.int32(-1), best)
    # Move the kept labels to the front, in order (a stable partition).
    order = lax.select(dropped, np.int32(steps), time)
    perm = knp.argsort(order, axis=-1)
    best = knp.take_along_axis(best, perm, axis=-1)
    total = lax.neg(lax.reduce_sum(scores, 1))
    return lax.expand_dims(best, 0), lax.expand_dims(total, -1)


def ctc_decode(
    inputs,
    sequence_lengths,
    strategy="greedy",
    beam_width=100,
    top_paths=1,
    merge_repeated=True,
    mask_index=0,
):
    inputs = lax.tensor(inputs)
    dtype = dtypes.result_type(lax.kdtype(inputs), "float32")
    inputs = lax.cast(inputs, dtype)
    lengths = lax.cast(lax.tensor(sequence_lengths), "int32")
    classes = inputs.shape[-1]
    if mask_index is None:
        mask_index = classes - 1
    if strategy == "greedy":
        return _greedy(inputs, lengths, merge_repeated, mask_index)
    if strategy == "beam_search":
        paths, scores = ctc_beam_search_p.bind(
            log_softmax(inputs, axis=-1),
            lengths,
            beam_width=int(beam_width),
            top_paths=int(top_paths),
            mask_index=int(mask_index),
        )
        return paths, scores
    raise ValueError(
        f"Invalid strategy {strategy}. Supported values are 'greedy' and "
        "'beam_search'."
    )
