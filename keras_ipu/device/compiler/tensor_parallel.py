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
holds a partial sum of the full shape; the value is their sum;
tensor_parallel_shardings.py). The rules, one per primitive family
(tensor_parallel_rules.py, _lookups.py, _loops.py), say which sharding of
the operands a split operation wants and what sharding its results get;
the walk that applies them is tensor_parallel_partitioner.py:

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
  writes such rows into a table split the same way; a table split on its
  vocabulary is Megatron's vocabulary-parallel lookup (each IPU looks up
  the ids of its rows, zeros for the others: PARTIAL rows), and its
  gradient's scatter adds only the rows of its own ids;
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
So do values a scatter makes from whole operands whose readers all read
them split (the gradient of a vocabulary-split table): `partition` walks
the program again with each such layout until none is added.
"""

import dataclasses

from keras_ipu.device.compiler.tensor_parallel_partitioner import Collective
from keras_ipu.device.compiler.tensor_parallel_partitioner import Partitioner
from keras_ipu.device.compiler.tensor_parallel_shardings import PARTIAL
from keras_ipu.device.compiler.tensor_parallel_shardings import divides
from keras_ipu.device.compiler.tensor_parallel_shardings import is_split
from keras_ipu.device.compiler.tensor_parallel_shardings import local_aval
from keras_ipu.device.ir import Graph
from keras_ipu.device.primitives import cost_util

__all__ = ["PARTIAL", "Collective", "Partitioned", "SplitProgram", "TensorParallel",
           "local_aval", "partition"]


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
        if not divides(aval, dim, k):
            raise ValueError(
                f"The layout of {tp.name(position)} {aval.short()} splits dimension {dim} "
                f"(size {aval.shape[dim]}) over the {k} IPUs of the mesh axis '{tp.axis}', "
                f"but {aval.shape[dim]} is not a multiple of {k}: a split gives every IPU "
                f"an equal block. Use a mesh axis whose size divides {aval.shape[dim]}, or "
                "leave that dimension unsplit (None) in the LayoutMap.")
        shardings[position] = dim
    given = {p for p, _ in tp.layouts}
    positions = {v: j for j, v in enumerate(graph.inputs)}
    if k == 1:
        return Partitioned(tp, graph, tuple(shardings), tuple([None] * len(graph.outputs)),
                           [], ())
    # Walk until the layouts inferred from the readers stop growing: a
    # split found in one walk (a scatter's gradient table) can make more
    # values read split in the next (that gradient's optimizer slots). A
    # layout once inferred is kept, so every walk but the last adds one at
    # least: the walks end.
    inferred, hints = {}, {}
    while True:
        walk = Partitioner(k, graph.inputs, dict(hints))
        local, outs = walk.graph(graph, shardings)
        added = False
        for value, wanted in walk.requests.items():
            if len(wanted) != 1:
                continue  # readers disagree: it stays whole
            (want,) = wanted
            if value in positions:
                j = positions[value]
                if j in given or j in inferred or not _is_layout(want, value, k):
                    continue
                inferred[j] = shardings[j] = want
                added = True
            elif value not in hints and _is_layout(want, value, k):
                hints[value] = want
                added = True
        if not added:
            return Partitioned(tp, local, tuple(shardings), tuple(outs), walk.collectives,
                               tuple(sorted(inferred)))


def _is_layout(want, value, k):
    return is_split(want) and divides(value.aval, want, k)
