"""The tensor-parallel rules of lookups (see tensor_parallel_rules.py for
what a rule returns): gather (an embedding's lookup) and scatter (its
gradient, rows added into a table of zeros).

A table is split one of two ways:

- on its rows' own dimensions (an embedding split on its features,
  LayoutMap (None, "model")): every IPU looks up its block of each row,
  and the rows come out split the same way; nothing crosses the links.
- on an addressed dimension (an embedding split on its vocabulary,
  ("model", None)): Megatron-LM's vocabulary-parallel embedding (Shoeybi
  et al. 2019, "Megatron-LM", section 3; VocabParallelEmbedding in its
  code): IPU i holds the rows [i V/k, (i+1) V/k) and looks up only the
  ids in that range, zero rows for the others, so each IPU's rows are a
  partial sum of the lookup (PARTIAL: one all-reduce where they are read
  whole). The gradient's scatter adds into the IPU's block only the
  rows of the ids in its range: the gradient of the table, and so the
  optimizer's slots, are split too.

Each IPU's range comes from its index on the axis (cross_replica_index
with the axis' k IPUs as replicas, XLA's replica-id in an SPMD program),
so the local program is one program for all of them. Ids outside the
whole table give zero rows on every IPU where the whole lookup in "fill"
mode gives its fill value (NaN): the values the user sees are computed
whole on the host (tensor_parallel.py), so only the never-run local
program differs there, for ids that are a bug of the program reading them.
"""

import numpy as np

from keras_ipu.device.compiler.tensor_parallel_shardings import PARTIAL
from keras_ipu.device.compiler.tensor_parallel_shardings import divides
from keras_ipu.device.compiler.tensor_parallel_shardings import is_split
from keras_ipu.device.ir import Literal
from keras_ipu.device.ir import Node
from keras_ipu.device.ir import Var
from keras_ipu.device.primitives import collective
from keras_ipu.device.primitives import convert
from keras_ipu.device.primitives import elementwise as ew
from keras_ipu.device.primitives import indexing


def _row_dims(node):
    """(first trailing dimension of the operand, first trailing dimension of
    the result) of a gather / scatter: the dimensions of each addressed row
    (an embedding's features), which a lookup copies as they are."""
    indices = node.inputs[1].aval
    b = node.params.get("batch_dims", 0)
    return b + indices.shape[-1], indices.ndim - 1


def _addressed(node, dim, k):
    """Whether `dim` of the table is one the ids address (not a batch
    dimension, not a row's own) and splits into k blocks."""
    row, _ = _row_dims(node)
    return node.params.get("batch_dims", 0) <= dim < row and divides(
        node.inputs[0].aval, dim, k)


def gather(p, node, have):
    sx = have[0]
    if not is_split(sx):
        return None
    row, out_row = _row_dims(node)
    if sx >= row:  # split on its features: rows split the same way
        return [sx, None], [out_row + sx - row], None
    if _addressed(node, sx, p.k):  # split on its vocabulary
        return [sx, None], [PARTIAL], None, _vocabulary_gather(sx)
    return None


def scatter(p, node, have):
    sx, su = have[0], have[2]
    row, out_row = _row_dims(node)
    if is_split(su) and su >= out_row:
        d = row + su - out_row
    elif is_split(sx):
        d = sx
    else:  # nothing split: the split the table's readers asked for
        d = p.hints.get(node.outputs[0])
    if not is_split(d):
        return None
    if d >= row:  # rows split on their features: the table's blocks of them
        return [d, None, out_row + d - row], [d], None
    if _addressed(node, d, p.k):  # the vocabulary: each IPU its rows' updates
        return [d, None, None], [d], None, _vocabulary_scatter(d)
    return None


def _vocabulary_gather(dim):
    def build(p, node, table, ids, out):
        ids = _ids_in_block(p, node, ids, dim, out)
        # Out of range in the block: a zero row (its owner looks it up).
        params = {**node.params, "mode": "fill", "fill_value": 0}
        return _emit(out, indexing.gather_p, [table, ids], params, node.source)

    return lambda p, node, operands, out: [build(p, node, *operands, out)]


def _vocabulary_scatter(dim):
    def build(p, node, table, ids, updates, out):
        # Out of range in the block: dropped, as any scatter drops them.
        ids = _ids_in_block(p, node, ids, dim, out)
        return _emit(out, indexing.scatter_p, [table, ids, updates], node.params,
                     node.source)

    return lambda p, node, operands, out: [build(p, node, *operands, out)]


def _ids_in_block(p, node, ids, dim, out):
    """The local program's ids into this IPU's block of the table (split on
    the addressed dimension `dim`): wrapped as the whole lookup wraps
    negative ids, clamped as a "clip" gather clamps them, less the block's
    first row; those outside the block point one row past it (out of range:
    a "fill" gather gives zeros there, a scatter drops them)."""
    table, index = node.inputs[0].aval, node.inputs[1].aval
    dtype = index.dtype
    column = dim - node.params.get("batch_dims", 0)
    depth = index.shape[-1]
    extent = np.asarray(table.shape[dim - column:dim - column + depth], dtype)
    rows = table.shape[dim] // p.k

    def emit(primitive, *inputs, **params):
        return _emit(out, primitive, list(inputs), params, node.source)

    def vector(values):
        return Literal(np.asarray(values, dtype))

    zero = Literal(np.asarray(0, dtype))
    ipu = emit(convert.convert_element_type_p,
               emit(collective.cross_replica_index_p, replicas=p.k), dtype=dtype)
    first_row = emit(ew.mul_p, ipu, vector(np.eye(depth, dtype=dtype)[column] * rows))
    ids = emit(ew.select_p, emit(ew.lt_p, ids, zero), emit(ew.add_p, ids, vector(extent)), ids)
    if node.primitive is indexing.gather_p and node.params["mode"] == "clip":
        ids = emit(ew.min_p, emit(ew.max_p, ids, zero), vector(extent - 1))
    local = emit(ew.sub_p, ids, first_row)
    past = extent.copy()
    past[column] = rows
    return emit(ew.select_p, emit(ew.lt_p, local, zero), vector(past), local)


def _emit(out, primitive, inputs, params, source):
    """Appends primitive(inputs; params) to `out`; its result."""
    var = Var(primitive.shape_rule(*(v.aval for v in inputs), **params))
    out.append(Node(primitive, inputs, params, [var], source))
    return var
