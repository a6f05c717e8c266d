"""The walk that builds one IPU's program of a tensor-parallel program.

`Partitioner.graph` visits the nodes in order; each is planned by its
primitive's rule (tensor_parallel_rules.py: which sharding it wants of
each operand, which its results get), its operands are resharded to what
the rule wants (the collectives and slices that takes are added to the
local program and listed in `collectives`), and the node is copied with
its local shapes (or, for a rule that needs more than a copy, built by
the rule: the vocabulary-parallel lookup masks its ids).

While walking, it notes what sharding the readers of some values ask
for (`requests`): of the program's inputs, and of the results of the
primitives that can make a split value from whole operands (scatter: a
gradient table that only ever meets a split weight). `partition`
(tensor_parallel.py) turns unanimous requests into inferred input
layouts and into `hints` for the next walk, GSPMD's backward propagation
of layouts.
"""

import dataclasses

import numpy as np

from keras_ipu.device.compiler import tensor_parallel_rules as rules
from keras_ipu.device.compiler.graph_utils import copy_node
from keras_ipu.device.compiler.tensor_parallel_shardings import PARTIAL
from keras_ipu.device.compiler.tensor_parallel_shardings import divides
from keras_ipu.device.compiler.tensor_parallel_shardings import is_split
from keras_ipu.device.compiler.tensor_parallel_shardings import local_aval
from keras_ipu.device.ir import Graph
from keras_ipu.device.ir import Literal
from keras_ipu.device.ir import Node
from keras_ipu.device.ir import ShapedArray
from keras_ipu.device.ir import Var
from keras_ipu.device.primitives import collective
from keras_ipu.device.primitives import cost_util
from keras_ipu.device.primitives.indexing import slice_p
from keras_ipu.device.primitives.shape_rules import ShapeError


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


class Partitioner:
    """Partitions graphs for one of the `k` IPUs of a mesh axis (module doc).
    `hints`: {value: sharding} its readers all asked for in an earlier walk."""

    def __init__(self, k, program_inputs=(), hints=None):
        self.k = k
        self.collectives = []
        self.repeat = 1
        self.hints = {} if hints is None else hints
        # program input or hintable result -> the shardings its readers asked for.
        self.requests = {}
        self._noted = set(program_inputs)  # the values whose requests are kept
        self._makers = {}  # value -> the whole elementwise node that made it
        self._asked = set()  # (value, want) already passed on by _ask

    def trial(self):
        """A partitioner for a trial walk of a sub-graph (a loop's carries,
        a cond's first branch): the same axis and hints; what it finds is
        not kept."""
        return Partitioner(self.k, (), self.hints)

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
                operand = self.reshard(v, operand, have, want, local.nodes, None)
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
        rule = rules.rule_for(node.primitive)
        hinted = any(self.hints.get(v) is not None for v in node.outputs)
        planned = None
        if rule is not None and (hinted or any(s is not None for s in have)):
            planned = rule(self, node, have)
        # A rule that builds its own nodes checks its split itself.
        if planned is not None and len(planned) == 3 and not self._fits(node, *planned):
            planned = None  # the rule's split does not type-check: read whole
        if planned is None:  # no rule, or nothing split: read every operand whole
            planned = ([None] * len(node.inputs), [None] * len(node.outputs), None)
        wanted, results, params = planned[:3]
        build = planned[3] if len(planned) > 3 else None
        # A node that reads nothing split has no say in an input's layout;
        # an elementwise one passes on what its readers ask of its result.
        asks = any(s is not None for s in have)
        if not asks and (node.primitive.elementwise or rule is rules.identity):
            for v in node.outputs:
                self._makers[v] = node
        if node.primitive.name in rules.HINTABLE:
            self._noted.update(node.outputs)
        operands = [self.reshard(v, operand, s, want, out, node.source, asks)
                    for v, (operand, s), want in zip(node.inputs, looked, wanted)]
        if build is not None:
            outputs = build(self, node, operands, out)
        else:
            params = node.params if params is None else params
            outputs = [Var(local_aval(v.aval, s, self.k))
                       for v, s in zip(node.outputs, results)]
            out.append(copy_node(node, operands, params=params, outputs=outputs))
        for v, lv, s in zip(node.outputs, outputs, results):
            env[v] = (lv, s)

    def _fits(self, node, wanted, results, params):
        """Whether the local node's shape rule gives the blocks the rule says
        (a split that does not divide a dimension falls back to whole)."""
        k = self.k
        for v, s in list(zip(node.inputs, wanted)) + list(zip(node.outputs, results)):
            if is_split(s) and not divides(v.aval, s, k):
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
        """Note that a reader wants `value` as `want`: for a program input or
        a hintable result, directly; through the whole elementwise ops that
        made it, for the values they read (GSPMD's backward propagation, far
        enough for an optimizer slot scaled before its update meets a split
        gradient). Each (value, want) is passed on once: a value read twice
        by one op (x * x) would otherwise double the walk at every level."""
        if (value, want) in self._asked:
            return
        self._asked.add((value, want))
        if value in self._noted:
            self.requests.setdefault(value, set()).add(want)
            return
        node = self._makers.get(value)
        if node is None or not is_split(want):
            return
        for v in node.inputs:
            if type(v) is Literal:
                continue
            d = want - (value.aval.ndim - v.aval.ndim)
            if d >= 0 and v.aval.shape[d] == value.aval.shape[want]:
                self._ask(v, d)

    # -- resharding --------------------------------------------------------
    def reshard(self, value, operand, have, want, out, source, asks=True):
        """`operand` (the local form of `value`, sharded `have`) as `want`
        on one IPU, with the nodes (collectives, slices) that takes. `asks`:
        the reader's want counts towards a noted value's requests."""
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
        out.append(Node(primitive, [operand], params, [var], source))
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
        out.append(Node(slice_p, [operand], params, [var], source))
        return var

    def repeated(self, times, partition):
        """partition() with the collectives it finds counted `times` times."""
        saved = self.repeat
        self.repeat = saved * max(1, int(times or 1))
        try:
            return partition()
        finally:
            self.repeat = saved
