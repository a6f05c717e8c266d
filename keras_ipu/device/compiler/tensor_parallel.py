"""Tensor parallelism: one program split over the k IPUs of a mesh axis.

    tp = TensorParallel.of(2, {0: 1, 1: 0}, names={0: "dense_1/kernel", ...})
    part = partition(graph, tp)       # part.local: one IPU's program
    part.collectives                  # the all-reduces / all-gathers it needs

Keras' ModelParallel / LayoutMap (and JAX's GSPMD, which Keras' JAX backend
hands them to) say how a weight is laid out: a dimension split over a mesh
axis of k devices. GSPMD then propagates the layouts of the weights to
every value of the program and partitions each operation into per-device
parts, with collectives where a part needs what another device holds
(Megatron-LM's column- and row-parallel layers are two cases of it).
Graphcore's TensorFlow SDK has no such thing (its model parallelism is
whole operations per IPU: sharding and pipelining); this is keras_ipu's
extension, so that Keras' own distribution API drives the simulated Pod.

What is split is the *prediction*, not the arithmetic: the simulator's
arrays live on the host, so the program still computes every value whole
(bit-identical to the unsplit run) and `partition` builds, beside it, the
program ONE IPU of the axis runs (SPMD: every IPU runs the same program on
its block), with the collectives between them. The cost and memory models
read that local program as they read any program: a split weight, its
gradient and its optimizer slots are 1/k of their bytes on each IPU, a
partitioned matmul is 1/k of the MACs, and each collective is costed by
its own cost rule (primitives/collective.py -> cost_model's ring
formulas over the IPU-Links).

A value's sharding is None (replicated: every IPU holds all of it), an
int d (split: IPU i holds block i of dimension d) or PARTIAL (every IPU
holds a partial sum of the full shape; the value is their sum). The rules,
one per primitive family (`_RULES`), say which sharding of the operands a
split operation wants and what sharding its results get:

- elementwise ops keep the split of their operands (a broadcast operand,
  e.g. a bias, is replicated or sliced to match);
- dot_general: an operand split on a free dimension gives a result split
  there (column-parallel); both operands split on a contracted dimension
  give a PARTIAL result (row-parallel), which becomes whole by an
  all-reduce where a reader needs it whole; split batch dimensions stay;
- reduce_sum over a split dimension gives PARTIAL (other dims keep their
  split); PARTIAL passes through reduce_sum and the cross-replica sums;
- reshape keeps a split whose dimension survives (or is the major one of a
  merge or a split), transpose and broadcast move it;
- conv_general_dilated split on the kernel's output features gives a
  result split on its features; split on the input features, PARTIAL;
- gather from a table split on its rows' own dimensions (an embedding
  split on its features) gives rows split so; scatter (its gradient)
  writes such rows into a table split the same way;
- scan (the device loop, accumulation loops) and while_loop: the body is
  partitioned with the carries' shardings, iterated until the carries keep
  their sharding; cond: every branch takes the operands as they come and
  leaves its results as the first branch does;
- anything without a rule reads its operands whole: a split operand is
  all-gathered first, a PARTIAL one all-reduced (the collectives the
  prediction then counts); its results are replicated.

Turning a replicated value into a split one costs no communication (each
IPU slices its block). Program inputs with no layout that only ever get
read split (the optimizer's slots of a split weight, by elementwise
updates) are given that split, as GSPMD propagates layouts back to
parameters: they then live 1/k on each IPU too (`Partitioned.inferred`).
"""

import dataclasses

import numpy as np

from keras_ipu.device.compiler.graph_utils import copy_node
from keras_ipu.device.ir import Graph
from keras_ipu.device.ir import Literal
from keras_ipu.device.ir import Node
from keras_ipu.device.ir import ShapedArray
from keras_ipu.device.ir import Var
from keras_ipu.device.primitives import collective
from keras_ipu.device.primitives import cost_util
from keras_ipu.device.primitives.dot import split_dimensions
from keras_ipu.device.primitives.indexing import slice_p
from keras_ipu.device.primitives.shape_rules import ShapeError
from keras_ipu.device.simulator import loop_trips

PARTIAL = "partial"

# Scan carries settle in a couple of rounds (a split spreads to a carry
# through its update); more means the rules disagree with themselves.
_MAX_CARRY_ROUNDS = 8


@dataclasses.dataclass(frozen=True)
class TensorParallel:
    """How a program's inputs are split over the `ipus` IPUs of one mesh
    axis: `layouts` ((input position, split dimension), ...); `names`
    ((input position, name), ...) for messages. Hashable: it is part of
    CompileOptions and so of the executable cache key."""

    ipus: int
    layouts: tuple
    names: tuple = ()
    axis: str = "model"

    @classmethod
    def of(cls, ipus, layouts, names=None, axis="model"):
        ipus = int(ipus)
        if ipus < 1:
            raise ValueError(f"A mesh axis has at least one IPU; got {ipus}.")
        return cls(ipus, tuple(sorted((int(p), int(d)) for p, d in dict(layouts).items())),
                   tuple(sorted((int(p), str(n)) for p, n in dict(names or {}).items())),
                   str(axis))

    def name(self, position):
        return dict(self.names).get(position, f"input {position}")


@dataclasses.dataclass
class Collective:
    """A collective the local program needs: `kind` ("all-reduce",
    "all-gather", "reduce-scatter") of a value of `aval` (its whole shape)
    made by `source`, run `count` times per run of the program (inside a
    loop: the loop's trips)."""

    kind: str
    aval: ShapedArray
    source: str
    count: int = 1

    @property
    def nbytes(self):
        return cost_util.nbytes(self.aval)


@dataclasses.dataclass
class Partitioned:
    """The result of `partition`: `local`, the program each IPU of the axis
    runs (its inputs are their blocks), the sharding of each input and
    output of the program, the collectives, and the input positions whose
    sharding was inferred (no layout given)."""

    tp: TensorParallel
    local: Graph
    input_shardings: tuple
    output_shardings: tuple
    collectives: list
    inferred: tuple

    def sharded_input_bytes(self, graph):
        """{input position: (whole bytes, bytes on one IPU)} of the split inputs."""
        return {
            j: (cost_util.nbytes(v.aval), cost_util.nbytes(self.local.inputs[j].aval))
            for j, (v, s) in enumerate(zip(graph.inputs, self.input_shardings))
            if s is not None
        }

    def summary(self):
        kinds = {}
        for c in self.collectives:
            n, b = kinds.get(c.kind, (0, 0))
            kinds[c.kind] = (n + c.count, b + c.count * c.nbytes)
        split = sum(s is not None for s in self.input_shardings)
        parts = ", ".join(f"{n} {k} ({b:,} B)" for k, (n, b) in sorted(kinds.items()))
        return (f"tensor parallel over {self.tp.ipus} IPUs of the mesh axis "
                f"'{self.tp.axis}': {split} inputs split; per run {parts or 'no collectives'}")


@dataclasses.dataclass
class SplitProgram:
    """What a split executable keeps (`exe.tensor_parallel`): the partition
    and the compiled program of one IPU (`local`: never run, it is what the
    cost and memory models read)."""

    partitioned: Partitioned
    local: object  # Executable

    @property
    def ipus(self):
        return self.partitioned.tp.ipus

    @property
    def collectives(self):
        return self.partitioned.collectives


def local_aval(aval, sharding, k):
    """The block of `aval` one of `k` IPUs holds under `sharding`."""
    if not isinstance(sharding, int) or isinstance(sharding, bool):
        return aval
    shape = list(aval.shape)
    shape[sharding] //= k
    return ShapedArray(shape, aval.dtype)


def _divides(aval, dim, k):
    size = aval.shape[dim] if 0 <= dim < aval.ndim else None
    return size is not None and size % k == 0


def partition(graph, tp):
    """The Partitioned program of `graph` under `tp` (see the module doc).
    Raises ValueError when a layout cannot split its input."""
    k = tp.ipus
    shardings = [None] * len(graph.inputs)
    for position, dim in tp.layouts:
        if not 0 <= position < len(graph.inputs):
            raise ValueError(
                f"A tensor-parallel layout names input {position}, but the program has "
                f"{len(graph.inputs)} inputs.")
        aval = graph.inputs[position].aval
        if not -aval.ndim <= dim < aval.ndim:
            raise ValueError(
                f"The layout of {tp.name(position)} {aval.short()} splits dimension {dim}, "
                f"which it does not have (rank {aval.ndim}): give one layout entry per "
                "dimension, None for the ones not split.")
        dim %= aval.ndim
        if not _divides(aval, dim, k):
            raise ValueError(
                f"The layout of {tp.name(position)} {aval.short()} splits dimension {dim} "
                f"(size {aval.shape[dim]}) over the {k} IPUs of the mesh axis '{tp.axis}', "
                f"but {aval.shape[dim]} is not a multiple of {k}: a split gives every IPU "
                f"an equal block. Use a mesh axis whose size divides {aval.shape[dim]}, or "
                "leave that dimension unsplit (None) in the LayoutMap.")
        shardings[position] = dim
    given = {p for p, _ in tp.layouts}
    if k == 1:
        return Partitioned(tp, graph, tuple(shardings), tuple([None] * len(graph.outputs)),
                           [], ())
    first = _Partitioner(k, graph.inputs)
    first.graph(graph, shardings)
    inferred = {}
    for j, v in enumerate(graph.inputs):
        wanted = first.requests.get(v, set())
        if j not in given and len(wanted) == 1:
            (want,) = wanted
            if isinstance(want, int) and _divides(v.aval, want, k):
                inferred[j] = want
    for j, d in inferred.items():
        shardings[j] = d
    final = _Partitioner(k, graph.inputs)
    local, outs = final.graph(graph, shardings)
    return Partitioned(tp, local, tuple(shardings), tuple(outs), final.collectives,
                       tuple(sorted(inferred)))


class _Partitioner:
    def __init__(self, k, program_inputs):
        self.k = k
        self.collectives = []
        self.repeat = 1
        self._inputs = set(program_inputs)
        # program input -> the shardings its readers asked for.
        self.requests = {}
        self._makers = {}  # value -> the whole elementwise node that made it

    # -- graphs ------------------------------------------------------------
    def graph(self, graph, in_shardings, out_wanted=None):
        """(local Graph, output shardings) of `graph` whose inputs have
        `in_shardings`; with `out_wanted`, its outputs resharded to those."""
        local = Graph()
        env = {}
        for v, s in zip(graph.inputs, in_shardings):
            lv = Var(local_aval(v.aval, s, self.k))
            local.inputs.append(lv)
            env[v] = (lv, s)
        for node in graph.nodes:
            self._node(node, env, local.nodes)
        outs, shardings = [], []
        for j, v in enumerate(graph.outputs):
            operand, have = self._lookup(v, env)
            # A result leaves whole or split, never as partial sums.
            want = (None if have == PARTIAL else have) if out_wanted is None else out_wanted[j]
            if want != have:
                operand = self._reshard(v, operand, have, want, local.nodes, None)
                have = want
            outs.append(operand)
            shardings.append(have)
        local.outputs = outs
        return local, shardings

    @staticmethod
    def _lookup(operand, env):
        if type(operand) is Literal:
            return operand, None
        return env[operand]

    def _node(self, node, env, out):
        looked = [self._lookup(v, env) for v in node.inputs]
        have = [s for _, s in looked]
        rule = _RULES.get(node.primitive.name)
        if rule is None and node.primitive.elementwise:
            rule = _elementwise
        planned = None
        if rule is not None and any(s is not None for s in have):
            planned = rule(self, node, have)
        if planned is not None and not self._fits(node, *planned):
            planned = None  # the rule's split does not type-check: read whole
        if planned is None:  # no rule, or nothing split: read every operand whole
            planned = ([None] * len(node.inputs), [None] * len(node.outputs), None)
        wanted, results, params = planned
        # A node that reads nothing split has no say in an input's layout;
        # an elementwise one passes on what its readers ask of its result.
        asks = any(s is not None for s in have)
        if not asks and (node.primitive.elementwise or rule is _identity):
            for v in node.outputs:
                self._makers[v] = node
        operands = []
        for v, (operand, s), want in zip(node.inputs, looked, wanted):
            operands.append(self._reshard(v, operand, s, want, out, node.source, asks))
        params = node.params if params is None else params
        outputs = [Var(local_aval(v.aval, s, self.k)) for v, s in zip(node.outputs, results)]
        out.append(copy_node(node, operands, params=params, outputs=outputs))
        for v, lv, s in zip(node.outputs, outputs, results):
            env[v] = (lv, s)

    def _fits(self, node, wanted, results, params):
        """Whether the local node's shape rule gives the blocks the rule says
        (a split that does not divide a dimension falls back to whole)."""
        k = self.k
        for v, s in list(zip(node.inputs, wanted)) + list(zip(node.outputs, results)):
            if _split(s) and not _divides(v.aval, s, k):
                return False
        avals = [local_aval(v.aval, s, k) for v, s in zip(node.inputs, wanted)]
        try:
            got = node.primitive.shape_rule(*avals,
                                            **(node.params if params is None else params))
        except (ShapeError, TypeError, ValueError):
            return False  # e.g. a shape parameter the rule did not localise
        got = tuple(got) if isinstance(got, (tuple, list)) else (got,)
        return list(got) == [local_aval(v.aval, s, k) for v, s in zip(node.outputs, results)]

    def _ask(self, value, want):
        """Note that a reader wants `value` as `want`: for a program input,
        directly; through the whole elementwise ops that made it, for the
        inputs they read (GSPMD's backward propagation, far enough for an
        optimizer slot scaled before its update meets a split gradient)."""
        if value in self._inputs:
            self.requests.setdefault(value, set()).add(want)
            return
        node = self._makers.get(value)
        if node is None or not _split(want):
            return
        for v in node.inputs:
            if type(v) is Literal:
                continue
            d = want - (value.aval.ndim - v.aval.ndim)
            if d >= 0 and v.aval.shape[d] == value.aval.shape[want]:
                self._ask(v, d)

    # -- resharding --------------------------------------------------------
    def _reshard(self, value, operand, have, want, out, source, asks=True):
        """`operand` (the local form of `value`, sharded `have`) as `want`
        on one IPU, with the nodes (collectives, slices) that takes. `asks`:
        the reader's want counts towards a program input's inferred layout."""
        if asks:
            self._ask(value, want)
        if have == want:
            return operand
        aval = value.aval
        if have == PARTIAL:
            if want is None:
                return self._collective("all-reduce", aval, operand, out, source)
            return self._collective("reduce-scatter", aval, operand, out, source, want)
        if have is not None:
            operand = self._collective("all-gather", aval, operand, out, source, have)
        if want is None:
            return operand
        return self._slice(operand, aval, want, out, source)

    def _collective(self, kind, aval, operand, out, source, dim=None):
        k = self.k
        group = (tuple(range(k)),)
        if kind == "all-reduce":
            primitive, params = collective.cross_replica_sum_p, dict(replicas=k, group_size=k)
            result = aval
        elif kind == "all-gather":
            primitive = collective.cross_replica_all_gather_p
            params = dict(replicas=k, groups=group, dimension=dim)
            result = aval
        else:
            primitive = collective.cross_replica_reduce_scatter_p
            params = dict(replicas=k, groups=group, op="sum", dimension=dim)
            result = local_aval(aval, dim, k)
        var = Var(result)
        out.append(_node_like(primitive, [operand], params, [var], source))
        self.collectives.append(Collective(kind, aval, source or primitive.name, self.repeat))
        return var

    def _slice(self, operand, aval, dim, out, source):
        """This IPU's block of a whole value (block 0: every block costs the same)."""
        block = local_aval(aval, dim, self.k)
        if type(operand) is Literal:
            index = tuple(slice(0, n) for n in block.shape)
            return Literal(np.asarray(operand.value)[index])
        var = Var(block)
        params = dict(start_indices=(0,) * aval.ndim, limit_indices=tuple(block.shape),
                      strides=(1,) * aval.ndim)
        out.append(_node_like(slice_p, [operand], params, [var], source))
        return var


def _node_like(primitive, inputs, params, outputs, source):
    return Node(primitive, inputs, params, outputs, source)


# -- rules: (partitioner, node, operand shardings) -> (wanted operand
# shardings, result shardings, local params or None for the same) or None
# (no split form: read everything whole) --------------------------------------
def _split(s):
    return isinstance(s, int) and not isinstance(s, bool)


def _elementwise(p, node, have):
    out = node.outputs[0].aval
    rank = out.ndim
    chosen = None
    for v, s in zip(node.inputs, have):
        if _split(s):
            e = s + rank - v.aval.ndim
            if v.aval.shape[s] == out.shape[e]:
                chosen = e
                break
    if chosen is None:
        return None
    wanted = []
    for v in node.inputs:
        d = chosen - (rank - v.aval.ndim)
        wanted.append(d if d >= 0 and v.aval.shape[d] == out.shape[chosen] else None)
    return wanted, [chosen] * len(node.outputs), None


def _identity(p, node, have):
    """Ops that pass each operand through unchanged (or sum it over
    replicas of another axis, which is linear): results as operands."""
    if len(node.inputs) != len(node.outputs):
        return None
    return list(have), list(have), None


def _broadcast_to(p, node, have):
    (s,) = have
    (x,) = node.inputs
    shape = tuple(node.params["shape"])
    if not _split(s):
        return None
    e = s + len(shape) - x.aval.ndim
    if x.aval.shape[s] != shape[e]:
        return None
    local = list(shape)
    local[e] //= p.k
    return [s], [e], {**node.params, "shape": tuple(local)}


def _reshape(p, node, have):
    (s,) = have
    if not _split(s):
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
    if not _split(s):
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
            if (_split(sl) and sl == a) or (_split(sr) and sr == b):
                return [a, b], [PARTIAL if partial else i], None
    if _split(sl):  # a free dimension of the lhs: its rows of the result
        return [sl, None], [len(lb) + lf.index(sl)], None
    if _split(sr):  # column-parallel
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
    if not _split(s) or s in axes:
        return None
    return [s], [s - sum(a < s for a in axes)] * len(node.outputs), None


def _conv(p, node, have):
    params = node.params
    if params.get("feature_group_count", 1) != 1 or params.get("batch_group_count", 1) != 1:
        return None
    lhs_spec, rhs_spec, out_spec = params["dimension_numbers"]
    sl, sr = have
    if (_split(sl) and sl == lhs_spec[1]) or (_split(sr) and sr == rhs_spec[1]):
        return [lhs_spec[1], rhs_spec[1]], [PARTIAL], None
    if _split(sr) and sr == rhs_spec[0]:
        return [None, sr], [out_spec[1]], None
    if _split(sl) and sl == lhs_spec[0]:
        return [sl, None], [out_spec[0]], None
    return None


def _row_dims(node):
    """(first trailing dimension of the operand, first trailing dimension of
    the result) of a gather / scatter: the dimensions of each addressed row
    (an embedding's features), which a lookup copies as they are."""
    indices = node.inputs[1].aval
    b = node.params.get("batch_dims", 0)
    return b + indices.shape[-1], indices.ndim - 1


def _gather(p, node, have):
    """A table split on its rows' own dimensions (an embedding split on its
    features) gives rows split the same way; a table split on an addressed
    dimension (its vocabulary) has no rule here: it is all-gathered."""
    sx, si = have[0], have[1]
    row, out_row = _row_dims(node)
    if not _split(sx) or si is not None or sx < row:
        return None
    return [sx, None], [out_row + sx - row], None


def _scatter(p, node, have):
    """The transpose of _gather (its gradient: rows added into a table):
    updates split on a row dimension write the table split on it."""
    sx, si, su = have[0], have[1], have[2]
    row, out_row = _row_dims(node)
    if _split(su) and su >= out_row:
        d = row + su - out_row
    elif _split(sx) and sx >= row:
        d = sx
    else:
        return None
    if si is not None:
        return None
    return [d, None, out_row + d - row], [d], None


def _whole(shardings):
    """Shardings a sub-graph's inputs take: splits kept, partial sums summed."""
    return [s if _split(s) else None for s in shardings]


def _settled_carries(p, body, carry, rest):
    """The carries' shardings a loop body keeps (a carry split inside the
    body, a weight's update or a slot's, is split from the start), found by
    partitioning the body until they stop changing; `rest`: the shardings
    of the body's other inputs, after the carries."""
    for _ in range(_MAX_CARRY_ROUNDS):
        _, outs = _Partitioner(p.k, ()).graph(body, carry + rest)
        settled = [c if c is not None else (o if _split(o) else None)
                   for c, o in zip(carry, outs[:len(carry)])]
        if settled == carry:
            break
        carry = settled
    return carry, _whole(outs[len(carry):])


def _repeated(p, times, partition):
    """partition() with the collectives it finds counted `times` times."""
    saved = p.repeat
    p.repeat = saved * max(1, int(times or 1))
    try:
        return partition()
    finally:
        p.repeat = saved


def _scan(p, node, have):
    params = node.params
    body = params["body"]
    n_carry, n_xs = params["n_carry"], params["n_xs"]
    carry = _whole(have[:n_carry])
    xs = [s - 1 if _split(s) and s > 0 else None for s in have[n_carry:n_carry + n_xs]]
    consts = _whole(have[n_carry + n_xs:])
    carry, ys = _settled_carries(p, body, carry, xs + consts)
    local_body, _ = _repeated(p, params.get("length"), lambda: p.graph(
        body, carry + xs + consts, out_wanted=carry + ys))
    wanted = carry + [x + 1 if x is not None else None for x in xs] + consts
    results = carry + [y + 1 if y is not None else None for y in ys]
    return wanted, results, {**params, "body": local_body}


def _while_loop(p, node, have):
    """As a scan's carries; the condition reads them as the body leaves
    them. Its trips: those its cost rule counts (simulator/loop_trips.py)."""
    params = node.params
    cond, body = params["cond_graph"], params["body_graph"]
    n_carry = len(cond.inputs) - params["n_cond_consts"]
    carry = _whole(have[:n_carry])
    cond_consts = _whole(have[n_carry:n_carry + params["n_cond_consts"]])
    body_consts = _whole(have[n_carry + params["n_cond_consts"]:])
    carry, _ = _settled_carries(p, body, carry, body_consts)
    local_cond, local_body = _repeated(p, loop_trips.trips(node), lambda: (
        p.graph(cond, carry + cond_consts, out_wanted=[None])[0],
        p.graph(body, carry + body_consts, out_wanted=carry)[0]))
    return (carry + cond_consts + body_consts, list(carry),
            {**params, "cond_graph": local_cond, "body_graph": local_body})


def _cond(p, node, have):
    """Every branch takes the operands as they are and leaves its results
    as the first branch does (the collectives of every branch are listed;
    the prediction counts the costliest branch, as the cond's cost rule)."""
    branches = node.params["branches"]
    operands = _whole(have[1:])
    _, outs = _Partitioner(p.k, ()).graph(branches[0], operands)
    outs = _whole(outs)
    local = tuple(p.graph(b, operands, out_wanted=outs)[0] for b in branches)
    return [None] + operands, outs, {**node.params, "branches": local}


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
    "gather": _gather,
    "scatter": _scatter,
    "scan": _scan,
    "while_loop": _while_loop,
    "cond": _cond,
    "cross_replica_sum": _identity,
    "cross_replica_mean": _identity,
    "stop_gradient": _identity,
    "optimization_barrier": _identity,
    "recomputation_checkpoint": _identity,
    "assume_equal_across_replicas": _identity,
}
