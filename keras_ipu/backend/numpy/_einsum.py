"""einsum on dot_general and reductions.

The subscripts are parsed to one label string per operand (an ellipsis
becomes fresh labels, broadcast right-aligned across operands). Then, as
XLA does: diagonals (a label repeated in one operand) are masked and
summed, labels only one operand has and the output lacks are summed out,
and the operands are contracted pairwise (in NumPy's greedy order when all
shapes are known), each pair being one dot_general whose shared labels are
batch dims if still needed, contracted otherwise.
"""

import string
from collections import Counter

import numpy as np

from keras_ipu.backend import prims as b
from keras_ipu.device.primitives.dot import dot_general_p


def _fail(subscripts, why):
    raise ValueError(f"einsum: invalid subscripts {subscripts!r}: {why}")


def parse(subscripts, shapes):
    """Label strings of the operands and of the output."""
    spec = subscripts.replace(" ", "")
    if "->" in spec:
        lhs, out = spec.split("->", 1)
        if "->" in out:
            _fail(subscripts, "more than one '->'")
    else:
        lhs, out = spec, None
    terms = lhs.split(",")
    if len(terms) != len(shapes):
        _fail(
            subscripts,
            f"{len(terms)} operand terms for {len(shapes)} operands",
        )
    for ch in spec.replace("...", "").replace(",", "").replace("->", ""):
        if ch not in string.ascii_letters:
            _fail(subscripts, f"{ch!r} is not a letter (labels are a-z, A-Z)")
    spare = [c for c in string.ascii_letters if c not in spec]

    pieces = []
    ell_rank = 0
    for term, shape in zip(terms, shapes):
        if term.count("...") > 1:
            _fail(subscripts, f"more than one ellipsis in {term!r}")
        if "..." in term:
            pre, post = term.split("...")
            k = len(shape) - len(pre) - len(post)
            if k < 0:
                _fail(subscripts, f"{term!r} has more labels than dims {shape}")
            ell_rank = max(ell_rank, k)
            pieces.append((pre, k, post))
        else:
            if len(term) != len(shape):
                _fail(
                    subscripts,
                    f"{term!r} has {len(term)} labels for an operand of "
                    f"shape {tuple(shape)}",
                )
            pieces.append((term, None, ""))
    if ell_rank > len(spare):
        _fail(subscripts, "too many dims under the ellipsis")
    ell = "".join(spare[:ell_rank])
    labels = [
        pre if k is None else pre + ell[ell_rank - k :] + post
        for pre, k, post in pieces
    ]
    if out is None:
        counts = Counter("".join(t for t, _, _ in pieces))
        out = ell + "".join(sorted(c for c, n in counts.items() if n == 1))
    else:
        if out.count("...") > 1:
            _fail(subscripts, "more than one ellipsis in the output")
        out = out.replace("...", ell)
    if len(set(out)) != len(out):
        _fail(subscripts, f"the output {out!r} repeats a label")
    known = set("".join(labels))
    for c in out:
        if c not in known:
            _fail(subscripts, f"output label {c!r} is in no operand")
    return labels, out


def _label_sizes(operands, labels):
    sizes = {}
    for x, lab in zip(operands, labels):
        for c, d in zip(lab, x.shape):
            if d is not None and d != 1:
                if sizes.get(c, d) != d:
                    raise ValueError(
                        f"einsum: label {c!r} has sizes {sizes[c]} and {d} in "
                        "different operands; they must match (or be 1)"
                    )
                sizes[c] = d
    return sizes


def _drop_broadcast_dims(x, lab, sizes):
    """Size-1 dims where another operand has a longer one broadcast: they
    carry nothing, so the label is dropped from this operand."""
    drop = [i for i, (c, d) in enumerate(zip(lab, x.shape)) if d == 1 and c in sizes]
    if not drop:
        return x, lab
    x = b.squeeze(x, drop)
    return x, "".join(c for i, c in enumerate(lab) if i not in drop)


def _take_diagonals(x, lab):
    while len(set(lab)) != len(lab):
        c = next(ch for ch in lab if lab.count(ch) > 1)
        i = lab.index(c)
        j = lab.index(c, i + 1)
        eye = b.eq(b.iota_like(x, i), b.iota_like(x, j))
        x = b.where(eye, x, b.const(0, x.dtype))
        x = b.reduce_sum(x, (j,))
        lab = lab[:j] + lab[j + 1 :]
    return x, lab


def _sum_out(x, lab, keep):
    axes = tuple(i for i, c in enumerate(lab) if c not in keep)
    if not axes:
        return x, lab
    return b.reduce_sum(x, axes), "".join(c for c in lab if c in keep)


def _contract(x, lx, y, ly, keep):
    lx_set, ly_set = set(lx), set(ly)
    x, lx = _sum_out(x, lx, keep | ly_set)
    y, ly = _sum_out(y, ly, keep | lx_set)
    shared = [c for c in lx if c in ly]
    batch = [c for c in shared if c in keep]
    summed = [c for c in shared if c not in keep]
    out = dot_general_p.bind(
        x,
        y,
        dimension_numbers=(
            (tuple(lx.index(c) for c in summed), tuple(ly.index(c) for c in summed)),
            (tuple(lx.index(c) for c in batch), tuple(ly.index(c) for c in batch)),
        ),
        preferred_element_type=None,
    )
    free_x = [c for c in lx if c not in ly]
    free_y = [c for c in ly if c not in lx]
    return out, "".join(batch + free_x + free_y)


def _path(labels, out, operands):
    """Pairs to contract, NumPy's convention: the pair's result is
    appended to the end of the operand list."""
    n = len(operands)
    if n > 2 and all(d is not None for x in operands for d in x.shape):
        spec = ",".join(labels) + "->" + out
        dummies = [np.broadcast_to(np.zeros((), np.float32), x.shape) for x in operands]
        path, _ = np.einsum_path(spec, *dummies, optimize="greedy")
        return [tuple(p) for p in path[1:]]
    return [(0, 1)] * (n - 1)


def einsum(subscripts, operands, preferred=None):
    if not operands:
        raise ValueError("einsum needs at least one operand")
    operands = list(operands)
    if preferred is not None:
        # int8 operands accumulate (and return) in int32.
        operands = [b.cast(x, preferred) for x in operands]
    labels, out = parse(subscripts, [x.shape for x in operands])
    sizes = _label_sizes(operands, labels)

    items = []
    for x, lab in zip(operands, labels):
        x, lab = _drop_broadcast_dims(x, lab, sizes)
        x, lab = _take_diagonals(x, lab)
        items.append((x, lab))
    # Labels held by one operand only and not in the output sum out first.
    for k, (x, lab) in enumerate(items):
        others = set(out).union(
            *(set(l) for j, (_, l) in enumerate(items) if j != k)
        )
        items[k] = _sum_out(x, lab, others)

    for group in _path([l for _, l in items], out, [x for x, _ in items]):
        # A step may join more than two operands: join them in turn.
        picked = [items[k] for k in group]
        rest = [it for k, it in enumerate(items) if k not in group]
        x, lx = picked[0]
        for n, (y, ly) in enumerate(picked[1:], start=2):
            later = rest + picked[n:]
            keep = set(out).union(*(set(l) for _, l in later))
            x, lx = _contract(x, lx, y, ly, keep)
        items = rest + [(x, lx)]

    (x, lab), = items
    x, lab = _sum_out(x, lab, set(out))
    missing = [c for c in out if c not in lab]
    if missing:
        # An output label every operand broadcast (size 1): it stays size 1.
        x = b.reshape(x, tuple(x.shape) + (1,) * len(missing))
        lab = lab + "".join(missing)
    return b.transpose(x, [lab.index(c) for c in out])
