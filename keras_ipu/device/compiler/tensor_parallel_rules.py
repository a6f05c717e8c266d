"""The sharding rules of tensor parallelism, one per primitive family.

A rule is called as rule(partitioner, node, have) with `have` the
shardings of the node's operands (tensor_parallel_shardings.py) and
returns None (no split form: the node reads every operand whole) or
(wanted, results, params): the sharding it wants of each operand, the
sharding of each result, and the node's local params (None: the same).
A rule whose local form is more than the node with local shapes adds a
fourth item, build(partitioner, node, operands, out) -> local results,
which appends the nodes it takes to `out` (tensor_parallel_lookups.py).

This module holds the rules of the dense operations; the lookups' are in
tensor_parallel_lookups.py, the control flow's in tensor_parallel_loops.py.
The rules choose locally: an elementwise op keeps the split that gathers
the fewest bytes; the others take the first split operand's (dot_general:
a split contracted pair before a split batch pair before a split free
dimension), and nothing looks further than the one node, so conflicting
layouts can cost collectives a global cost-based choice (GSPMD's) would
avoid; the partitioner lists each one, so the prediction counts them.
"""

import numpy as np

from keras_ipu.device.compiler import tensor_parallel_lookups as lookups
from keras_ipu.device.compiler import tensor_parallel_loops as loops
from keras_ipu.device.compiler.tensor_parallel_shardings import PARTIAL
from keras_ipu.device.compiler.tensor_parallel_shardings import is_split
from keras_ipu.device.primitives import cost_util
from keras_ipu.device.primitives.dot import split_dimensions


def elementwise(p, node, have):
    """A split operand's dimension (aligned from the right, as broadcasting
    aligns) splits the result and every operand that spans it; operands
    broadcast along it are read whole. Where operands are split on
    different dimensions, the split kept is the one that gathers the fewest
    bytes of the others (the first on a tie): a small split vector added
    to a large split matrix is gathered, not the matrix."""
    out = node.outputs[0].aval
    rank = out.ndim
    candidates = []
    for v, s in zip(node.inputs, have):
        if is_split(s):
            e = s + rank - v.aval.ndim
            if v.aval.shape[s] == out.shape[e] and e not in candidates:
                candidates.append(e)
    if not candidates:
        return None

    def wanted(chosen):
        plan = []
        for v in node.inputs:
            d = chosen - (rank - v.aval.ndim)
            plan.append(d if d >= 0 and v.aval.shape[d] == out.shape[chosen] else None)
        return plan

    def gathered(chosen):
        return sum(cost_util.nbytes(v.aval) for v, s, w in zip(node.inputs, have, wanted(chosen))
                   if is_split(s) and s != w)

    chosen = min(candidates, key=gathered)
    return wanted(chosen), [chosen] * len(node.outputs), None


def identity(p, node, have):
    """Ops that pass each operand through unchanged (or sum it over
    replicas of another axis, which is linear): results as operands."""
    if len(node.inputs) != len(node.outputs):
        return None
    return list(have), list(have), None


def _broadcast_to(p, node, have):
    (s,) = have
    (x,) = node.inputs
    shape = tuple(node.params["shape"])
    if not is_split(s):
        return None
    e = s + len(shape) - x.aval.ndim
    if x.aval.shape[s] != shape[e]:
        return None
    local = list(shape)
    local[e] //= p.k
    return [s], [e], {**node.params, "shape": tuple(local)}


def _reshape(p, node, have):
    (s,) = have
    if not is_split(s):
        return None
    src = node.inputs[0].aval.shape
    dst = node.outputs[0].aval.shape
    if None in src or None in dst:
        return None
    before = int(np.prod(src[:s]))
    # Block i of dimension s is, within each run of the dimensions before
    # it, the i-th contiguous 1/k of the elements; so is block i of a
    # result dimension e with as many elements before it (the same runs):
    # the split survives a reshape that keeps, merges or splits it, as long
    # as e divides by k.
    for e in range(len(dst)):
        if int(np.prod(dst[:e])) == before and dst[e] % p.k == 0:
            local = list(dst)
            local[e] //= p.k
            return [s], [e], {**node.params, "new_shape": tuple(local)}
    return None


def _transpose(p, node, have):
    (s,) = have
    if not is_split(s):
        return None
    return [s], [tuple(node.params["permutation"]).index(s)], None


def _dot_general(p, node, have):
    sl, sr = have
    lhs, rhs = node.inputs[0].aval, node.inputs[1].aval
    lc, rc, lb, rb, lf, rf = split_dimensions(lhs.ndim, rhs.ndim,
                                              node.params["dimension_numbers"])
    # A contracted pair split (row-parallel: partial sums), then a batch
    # pair (the result keeps it): both operands split on the pair.
    for pairs, partial in ((zip(lc, rc), True), (zip(lb, rb), False)):
        for i, (a, b) in enumerate(pairs):
            if (is_split(sl) and sl == a) or (is_split(sr) and sr == b):
                return [a, b], [PARTIAL if partial else i], None
    if is_split(sl):  # a free dimension of the lhs: its rows of the result
        return [sl, None], [len(lb) + lf.index(sl)], None
    if is_split(sr):  # column-parallel
        return [None, sr], [len(lb) + len(lf) + rf.index(sr)], None
    return None


def _axes(node):
    return {a % node.inputs[0].aval.ndim for a in node.params["axes"]}


def _reduce_sum(p, node, have):
    (s,) = have
    if s == PARTIAL:
        return [PARTIAL], [PARTIAL], None
    axes = _axes(node)
    if s in axes:
        return [s], [PARTIAL], None
    return [s], [s - sum(a < s for a in axes)], None


def _reduce_keeping(p, node, have):
    """max/min/...: only a split dimension that is not reduced stays split."""
    (s,) = have
    axes = _axes(node)
    if not is_split(s) or s in axes:
        return None
    return [s], [s - sum(a < s for a in axes)] * len(node.outputs), None


def _conv(p, node, have):
    params = node.params
    if params.get("feature_group_count", 1) != 1 or params.get("batch_group_count", 1) != 1:
        return None
    lhs_spec, rhs_spec, out_spec = params["dimension_numbers"]
    sl, sr = have
    if (is_split(sl) and sl == lhs_spec[1]) or (is_split(sr) and sr == rhs_spec[1]):
        return [lhs_spec[1], rhs_spec[1]], [PARTIAL], None
    if is_split(sr) and sr == rhs_spec[0]:
        return [None, sr], [out_spec[1]], None
    if is_split(sl) and sl == lhs_spec[0]:
        return [sl, None], [out_spec[0]], None
    return None


_RULES = {
    "dot_general": _dot_general,
    "reduce_sum": _reduce_sum,
    "reduce_max": _reduce_keeping,
    "reduce_min": _reduce_keeping,
    "reduce_prod": _reduce_keeping,
    "reshape": _reshape,
    "transpose": _transpose,
    "broadcast_to": _broadcast_to,
    "conv_general_dilated": _conv,
    "gather": lookups.gather,
    "scatter": lookups.scatter,
    "scan": loops.scan,
    "while_loop": loops.while_loop,
    "cond": loops.cond,
    "cross_replica_sum": identity,
    "cross_replica_mean": identity,
    "stop_gradient": identity,
    "optimization_barrier": identity,
    "recomputation_checkpoint": identity,
    "assume_equal_across_replicas": identity,
}

# Primitives whose rule can split a result none of whose operands is split,
# when its readers all asked for that split in an earlier walk (the hints:
# tensor_parallel_partitioner.py): a scatter making a split weight's gradient.
HINTABLE = frozenset({"scatter"})


def rule_for(primitive):
    """The rule of `primitive`, or None (it reads its operands whole)."""
    rule = _RULES.get(primitive.name)
    if rule is None and primitive.elementwise:
        return elementwise
    return rule
