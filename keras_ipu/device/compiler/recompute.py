"""Recomputation: the backward pass recomputes forward activations instead
of keeping them alive from the forward pass.

A training program computes activations in its forward pass and reads many
of them again in its backward pass, so they are live across the whole
program. With recomputation on, a backward node reads a *recomputed copy*
of each such activation instead, computed just before it from values that
are kept anyway: the program's inputs (the batch, the stage inputs), the
values marked with `recomputation_checkpoint` (the RecomputationCheckpoint
layer), values still needed later by non-backward nodes (weights read by
the optimizer, outputs) and backward values. The originals then die in the
forward pass; the memory model sees the program as it now runs.

Which nodes are backward: the autodiff records them with a
trace.BackwardSource. The modes are Graphcore's RecomputationMode:

- RecomputeAndBackpropagateInterleaved: each backward node gets its
  recomputed inputs right before it, restarting from the nearest stored
  values, so a segment between two checkpoints is recomputed when the
  backward pass reaches it and its copies die when it leaves it: live
  activations are the stored checkpoints plus one segment's.
- RecomputeThenBackpropagate: every recomputed value is made before the
  first backward node; checkpoints are recomputed like any value (as on
  the IPU, they have no effect in this mode).
- Auto: RecomputeAndBackpropagateInterleaved (a pipeline resolves Auto by
  its schedule before compiling).

Values are unchanged: a copy runs the same primitive on equal operands
(random bits come from their keys, which are recomputed or kept too).
The stored values a recomputation starts from are read through an
`optimization_barrier` placed with the backward node, as XLA does, so
common-subexpression elimination can never merge a copy back into the
forward node it repeats, and the copies cannot be scheduled early. The
pass is idempotent (copies and barriers are backward nodes) and is applied
to loop and branch bodies too (the training step of `fit` is the body of
the device loop's scan).
"""

import enum

from keras_ipu.device.compiler.graph_utils import copy_node
from keras_ipu.device.compiler.graph_utils import map_subgraphs
from keras_ipu.device.compiler.graph_utils import rebuilt
from keras_ipu.device.compiler.graph_utils import substitute
from keras_ipu.device.ir import Literal
from keras_ipu.device.ir import Var
from keras_ipu.device.primitives.control_flow import optimization_barrier_p
from keras_ipu.device.primitives.inter_ipu import ipu_copy_p
from keras_ipu.device.primitives.markers import recomputation_checkpoint_p
from keras_ipu.device.trace import backward_source
from keras_ipu.device.trace import is_backward


class RecomputationMode(enum.Enum):
    """Graphcore's `pipelining_ops.RecomputationMode` (same members and
    values)."""

    Auto = 0
    RecomputeThenBackpropagate = 1
    RecomputeAndBackpropagateInterleaved = 2


def as_mode(value):
    """A RecomputationMode from a member, its name or its value; None and
    False mean off, True means Auto."""
    if value is None or value is False:
        return None
    if value is True:
        return RecomputationMode.Auto
    if isinstance(value, RecomputationMode):
        return value
    name = getattr(value, "name", value)  # another module's enum member
    for mode in RecomputationMode:
        if name == mode.name or (isinstance(name, int) and name == mode.value):
            return mode
    raise ValueError(
        f"recomputation={value!r} is not a recomputation mode. Use one of "
        f"{', '.join('RecomputationMode.' + m.name for m in RecomputationMode)}"
        ", or None for no recomputation."
    )


def recompute(graph, mode):
    """`graph` with its backward nodes reading recomputed activations (see
    the module doc); `mode` is a RecomputationMode. With None (no
    recomputation) and RecomputeThenBackpropagate, checkpoints mean nothing
    and are removed (their result is their operand)."""
    mode = as_mode(mode)
    if mode is RecomputationMode.Auto:
        mode = RecomputationMode.RecomputeAndBackpropagateInterleaved
    nodes = [_with_bodies(node, mode) for node in graph.nodes]
    env = {}
    if mode is not RecomputationMode.RecomputeAndBackpropagateInterleaved:
        nodes, env = _without_checkpoints(nodes)
    if mode is None or not any(is_backward(node.source) for node in nodes):
        if not env and all(a is b for a, b in zip(nodes, graph.nodes)):
            return graph  # nothing to do: the same graph (and bodies)
        return rebuilt(graph, nodes, env)
    return _Rewrite(rebuilt(graph, nodes, env), mode).run()


def _with_bodies(node, mode):
    params = map_subgraphs(node, lambda g: recompute(g, mode))
    if all(_same(params[k], node.params[k]) for k in params):
        return node
    return copy_node(node, node.inputs, params=params)


def _same(a, b):
    if isinstance(a, tuple) and isinstance(b, tuple):
        return len(a) == len(b) and all(x is y for x, y in zip(a, b))
    return a is b


def _without_checkpoints(nodes):
    env = {}
    kept = []
    for node in nodes:
        inputs = [substitute(v, env) for v in node.inputs]
        if node.primitive is recomputation_checkpoint_p:
            env[node.outputs[0]] = inputs[0]
        else:
            kept.append(node if inputs == node.inputs else copy_node(node, inputs))
    return kept, env


class _Rewrite:
    def __init__(self, graph, mode):
        self.graph = graph
        self.nodes = nodes = graph.nodes
        self.interleaved = mode is RecomputationMode.RecomputeAndBackpropagateInterleaved
        self.backward = [is_backward(n.source) for n in nodes]
        self.made_at = {v: i for i, n in enumerate(nodes) for v in n.outputs}
        # A checkpoint's operand is its result: the backward pass reads the
        # stored result instead of recomputing the operand.
        self.checkpointed = {
            n.inputs[0]: n.outputs[0] for n in nodes
            if n.primitive is recomputation_checkpoint_p and type(n.inputs[0]) is Var
        }
        # The last step at which a non-backward node (or the program's
        # result) still needs each value: until then it is live anyway.
        self.needed_until = {}
        for i, node in enumerate(nodes):
            if not self.backward[i]:
                for v in node.inputs:
                    if type(v) is Var:
                        self.needed_until[v] = i
        for v in graph.outputs:
            if type(v) is Var:
                self.needed_until[v] = len(nodes)
        # Values a forward node of another pipeline stage reads: the stage
        # inputs a pipeline stashes (Graphcore recomputes a stage from them).
        self.stage_inputs = set()
        for i, node in enumerate(nodes):
            if self.backward[i] or node.stage is None:
                continue
            for v in node.inputs:
                made = self.made_at.get(v) if type(v) is Var else None
                if made is not None and nodes[made].stage not in (None, node.stage):
                    self.stage_inputs.add(v)
        # Forward value -> its recomputed copy, or its barrier'd stored value.
        self.replacement = {}
        self.emitted = []

    def run(self):
        first = self.backward.index(True)
        for i, node in enumerate(self.nodes):
            if not self.backward[i] or node.primitive is optimization_barrier_p:
                # A backward barrier (one this pass made before) only
                # passes a stored value on.
                self.emitted.append(node)
                continue
            if self.interleaved:
                self._recompute_for(node.inputs, i)
            elif i == first:
                self._recompute_for([
                    v for j, n in enumerate(self.nodes) if self.backward[j]
                    for v in n.inputs
                ], first)
            inputs = [self._operand(v, i) for v in node.inputs]
            self.emitted.append(copy_node(node, inputs))
        return rebuilt(self.graph, self.emitted, {})

    # -- what a value read at step `at` is --------------------------------
    def _kept(self, v, at):
        """Read as it is: a constant, a backward value, or a value the
        program keeps alive past `at` anyway."""
        if type(v) is Literal:
            return True
        made = self.made_at.get(v)
        if made is not None and (self.backward[made] or made > at):
            return True  # made after `at`: a non-backward node in between
        return self.needed_until.get(v, -1) > at

    def _stored(self, v):
        """A value recomputation starts from: a program input (the batch,
        a loop's carried state), a pipeline stage's input (a value another
        stage made, or another IPU sent), or, interleaved, a checkpoint."""
        made = self.made_at.get(v)
        if made is None or v in self.stage_inputs:
            return True
        producer = self.nodes[made].primitive
        if producer is ipu_copy_p:
            return True
        return self.interleaved and producer is recomputation_checkpoint_p

    def _recompute_for(self, reads, at):
        """Emit the copies (and barriers) that the forward values `reads`,
        read at step `at`, need: the forward nodes between them and the
        stored values, in program order."""
        todo = set()
        reads = [self._alias(v) for v in reads if type(v) is Var]
        stack = list(reads)
        seen = set()
        while stack:
            v = stack.pop()
            if v in seen or v in self.replacement or self._kept(v, at):
                continue
            seen.add(v)
            if self._stored(v):
                continue
            made = self.made_at[v]
            todo.add(made)
            stack.extend(self._alias(u) for u in self.nodes[made].inputs
                         if type(u) is Var)
        for v in reads:
            if v in seen and self._stored(v):
                self._barrier(v, at)
        for index in sorted(todo):
            self._copy(self.nodes[index], at)

    def _alias(self, v):
        return self.checkpointed.get(v, v)

    def _operand(self, u, at):
        if type(u) is not Var:
            return u
        u = self._alias(u)
        if u in self.replacement or self._kept(u, at):
            return self.replacement.get(u, u)
        if self._stored(u):
            return self._barrier(u, at)
        return u  # a forward value that needed no copy (see _copy)

    def _copy(self, node, at):
        inputs = [self._operand(u, at) for u in node.inputs]
        if all(a is b for a, b in zip(inputs, node.inputs)):
            # Made from kept values only: a copy would be the same node
            # (CSE would merge it back), so the original stays alive.
            return
        outputs = [Var(v.aval) for v in node.outputs]
        copy = copy_node(node, inputs, outputs=outputs)
        copy.source = backward_source(node.source)  # a node of the backward pass
        self.emitted.append(copy)
        for old, new in zip(node.outputs, outputs):
            self.replacement[old] = new

    def _barrier(self, v, at):
        """v read through a barrier placed with the backward node at `at`
        (its stage and IPU)."""
        if v not in self.replacement:
            out = Var(v.aval)
            barrier = copy_node(self.nodes[at], [v], params={}, outputs=[out],
                                primitive=optimization_barrier_p)
            made = self.made_at.get(v)
            barrier.source = backward_source(
                self.nodes[made].source if made is not None else None)
            self.emitted.append(barrier)
            self.replacement[v] = out
        return self.replacement[v]
