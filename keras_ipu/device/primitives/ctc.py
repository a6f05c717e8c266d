"""CTC prefix beam search (the kernel of TF's CTCBeamSearchDecoder).

A discrete search with data-dependent merging of equal prefixes is a
distinct kernel, not a composition of array ops, so it is one primitive.
The kernel is vectorised over the batch and the beam; it loops over time.
Prefixes are identified by a 64-bit rolling hash plus their length, so
merging equal prefixes is one sort over the whole batch.
"""

import numpy as np

from keras_ipu.device.ir import ShapedArray
from keras_ipu.device.primitives.registry import Primitive

_PAD = -1
_HASH_MULT = np.uint64(0x9E3779B97F4A7C15)


def _check(beam_width, top_paths):
    if top_paths > beam_width:
        raise ValueError(
            f"top_paths={top_paths} is larger than beam_width={beam_width}; "
            "a beam search keeps at most beam_width paths. Lower top_paths "
            "or raise beam_width."
        )


def _beam_rule(log_probs, lengths, *, beam_width, top_paths, mask_index):
    _check(beam_width, top_paths)
    b, t, _ = log_probs.shape
    return (
        ShapedArray((top_paths, b, t), np.int32),
        ShapedArray((b, top_paths), log_probs.dtype),
    )


def _logaddexp_groups(values, groups, n_groups):
    """Log-sum-exp of `values` within each group id (flat arrays)."""
    peak = np.full(n_groups, -np.inf)
    np.maximum.at(peak, groups, values)
    safe_peak = np.where(np.isfinite(peak), peak, 0.0)
    total = np.zeros(n_groups)
    np.add.at(total, groups, np.exp(values - safe_peak[groups]))
    with np.errstate(divide="ignore"):
        return np.log(total) + safe_peak


def _merge(keys, batch, p_blank, p_label):
    """Merge candidates with equal (batch, key): sums their probabilities.
    Returns merged p_blank, p_label per candidate, and a mask of the first
    candidate of each group."""
    shape = p_blank.shape
    flat = np.stack([np.broadcast_to(batch, shape).ravel(),
                     keys.ravel().view(np.int64)], axis=1)
    _, first, inverse = np.unique(flat, axis=0, return_index=True,
                                  return_inverse=True)
    inverse = inverse.ravel()
    n = len(first)
    mb = _logaddexp_groups(p_blank.ravel(), inverse, n)[inverse]
    ml = _logaddexp_groups(p_label.ravel(), inverse, n)[inverse]
    leader = np.zeros(inverse.size, bool)
    leader[first] = True
    return mb.reshape(shape), ml.reshape(shape), leader.reshape(shape)


def _beam_search(log_probs, lengths, *, beam_width, top_paths, mask_index):
    _check(beam_width, top_paths)
    out_dtype = log_probs.dtype
    lp = log_probs.astype(np.float64)
    batch, steps, classes = lp.shape
    w = beam_width
    rows = np.arange(batch)[:, None]
    # Beams: prefix labels, prefix length, hash, log p(ending in blank),
    # log p(ending in a label). Start: one empty prefix, certain.
    prefix = np.full((batch, w, steps), _PAD, np.int32)
    plen = np.zeros((batch, w), np.int64)
    key = np.zeros((batch, w), np.uint64)
    p_blank = np.full((batch, w), -np.inf)
    p_blank[:, 0] = 0.0
    p_label = np.full((batch, w), -np.inf)
    labels = np.array([c for c in range(classes) if c != mask_index])
    nl = len(labels)
    for t in range(steps):
        x = lp[:, t, :]  # (B, C)
        last = np.where(
            plen > 0,
            np.take_along_axis(prefix, np.maximum(plen - 1, 0)[..., None], 2)[..., 0],
            _PAD,
        )
        total = np.logaddexp(p_blank, p_label)
        # Stay: the prefix is unchanged (a blank, or a repeated last label).
        x_last = np.where(last >= 0, np.take_along_axis(
            x, np.maximum(last, 0), 1), -np.inf)
        stay_blank = total + x[:, mask_index][:, None]
        stay_label = p_label + x_last
        # Extend: append label c; after the same label only via a blank.
        same = last[..., None] == labels  # (B, W, L)
        base = np.where(same, p_blank[..., None], total[..., None])
        ext_label = base + x[:, labels][:, None, :]
        with np.errstate(over="ignore"):
            ext_key = key[..., None] * _HASH_MULT + (labels + 1).astype(np.uint64)
        ext_key ^= (plen[..., None] + 1).astype(np.uint64) << np.uint64(56)
        # Candidates: W stays then W*L extensions.
        cand_key = np.concatenate([key, ext_key.reshape(batch, w * nl)], 1)
        cand_blank = np.concatenate(
            [stay_blank, np.full((batch, w * nl), -np.inf)], 1)
        cand_label = np.concatenate([stay_label, ext_label.reshape(batch, -1)], 1)
        mb, ml, leader = _merge(cand_key, rows, cand_blank, cand_label)
        # Only one candidate per prefix carries the merged mass; the others
        # (picked only when fewer prefixes than beams exist) carry none.
        mb = np.where(leader, mb, -np.inf)
        ml = np.where(leader, ml, -np.inf)
        score = np.logaddexp(mb, ml)
        top = np.argsort(-score, axis=1, kind="stable")[:, :w]
        parent = np.where(top < w, top, (top - w) // nl)
        appended = np.where(top < w, _PAD, labels[(top - w) % nl])
        new_prefix = np.take_along_axis(prefix, parent[..., None], 1)
        new_plen = np.take_along_axis(plen, parent, 1)
        grow = appended != _PAD
        pos = np.minimum(new_plen, steps - 1)
        cur = np.take_along_axis(new_prefix, pos[..., None], 2)[..., 0]
        np.put_along_axis(new_prefix, pos[..., None],
                          np.where(grow, appended, cur)[..., None], 2)
        new_plen = new_plen + grow
        # Finished sequences keep their beams.
        live = (t < lengths)[:, None]
        prefix = np.where(live[..., None], new_prefix, prefix)
        plen = np.where(live, new_plen, plen)
        key = np.where(live, np.take_along_axis(cand_key, top, 1), key)
        p_blank = np.where(live, np.take_along_axis(mb, top, 1), p_blank)
        p_label = np.where(live, np.take_along_axis(ml, top, 1), p_label)
    score = np.logaddexp(p_blank, p_label)
    best = np.argsort(-score, axis=1, kind="stable")[:, :top_paths]
    paths = np.take_along_axis(prefix, best[..., None], 1)  # (B, K, T)
    scores = np.take_along_axis(score, best, 1)
    return (
        np.ascontiguousarray(paths.transpose(1, 0, 2)).astype(np.int32),
        scores.astype(out_dtype),
    )


ctc_beam_search_p = Primitive(
    "ctc_beam_search",
    _beam_rule,
    _beam_search,
    multiple_results=True,
    nondiff="discrete search: integer paths",
    doc="CTC prefix beam search: (log_probs[B,T,C], lengths[B]) -> "
        "(paths[top_paths,B,T], scores[B,top_paths]).",
)


# -- cost rules (formulas and constants: keras_ipu/device/simulator/cost_model.py)
from keras_ipu.device.primitives import cost_util as _cost  # noqa: E402


def _beam_flops(ins, outs, *, beam_width, top_paths, mask_index):
    # Every time step extends each beam by every class, then keeps the best:
    # (T x classes x beam) scores and a sort of them.
    expanded = _cost.size(ins[0]) * beam_width
    return expanded * (1 + _cost.log2(beam_width))


ctc_beam_search_p.cost = _cost.per_output("sort", _beam_flops)
