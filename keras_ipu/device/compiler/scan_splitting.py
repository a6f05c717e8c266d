"""Loop splitting for scans: a product in a scan body that no other
iteration's result feeds runs once, outside the loop, over all iterations.

A recurrent layer's scans multiply per-step operands by weights; only the
products on the recurrent path (h_{t-1} W_h and its gradient dh W_h^T)
need the previous step. The others become one product over the stacked
steps ([T*B, F] rows instead of T products of B rows: fewer kernels, and
BLAS runs larger blocks), as cuDNN's and XLA-compiled RNNs do:

- Hoisting: `dot_general(x_t, w)`, x_t an xs slice and w a constant of
  the loop, is computed before the loop as one product of the xs stack,
  and the body reads its slice as a new xs operand (the input projection
  of the forward pass).
- Accumulators: a carry whose only use is `c + v` (the body's new carry),
  v a product of two per-step values or a sum of one, becomes one product
  (or sum) over the stacked operands after the loop, contracting the
  steps too, added to the initial carry: the weight and bias gradients of
  the backward pass, sum_t h_{t-1}^T dz_t = H^T dZ.
- Sinking: a stacked output `dot_general(p_t, w)`, w a constant, becomes
  one product of the stacked p after the loop (the input gradient dz_t
  W_x^T of the backward pass).

- Last steps: a stacked output that is also a carry, read only by
  slices of the last step the loop runs (Keras' RNN takes outputs[-1]),
  is read from the final carry instead, and is no longer stacked.

A per-step operand the loop does not already stack (an xs operand's stack
is its outer value) is stacked as a new output of the scan. The new
stacks of a scan may hold at most as many bytes as the stacks it already
reads and writes (its xs operands and stacked outputs): an LSTM's loops
qualify (autodiff stacks several per-step residuals of the same size),
while a device loop accumulating gradients over micro-batches keeps its
accumulators rather than holding every micro-batch's activations. The
rewrites
change where products run and the order of the accumulators' additions
(one contraction over steps and rows instead of a running sum), not what
is computed; the cost model counts the products where they now run, as
the IPU would run the split program. CompileOptions.split_scans turns it
off.
"""

from keras_ipu.device import liveness
from keras_ipu.device.compiler.dead_code import eliminate_dead_code
from keras_ipu.device.compiler.dot_transpose import fold_dot_transposes
from keras_ipu.device.compiler.graph_utils import copy_node
from keras_ipu.device.compiler.graph_utils import map_subgraphs
from keras_ipu.device.compiler.graph_utils import rebuilt
from keras_ipu.device.compiler.graph_utils import substitute
from keras_ipu.device.ir import Graph
from keras_ipu.device.ir import Literal
from keras_ipu.device.ir import Node
from keras_ipu.device.ir import ShapedArray
from keras_ipu.device.ir import Var
from keras_ipu.device.primitives.control_flow import scan_p
from keras_ipu.device.primitives.dot import dot_general_p
from keras_ipu.device.primitives.elementwise import add_p
from keras_ipu.device.primitives.indexing import slice_p
from keras_ipu.device.primitives.reduce import reduce_sum_p
from keras_ipu.device.primitives.structure import reshape_p

import numpy as np


def _plain_dims(node):
    """(lhs contracting, rhs contracting) of a dot_general without batch
    dimensions, or None."""
    (lc, rc), (lb, rb) = node.params["dimension_numbers"]
    if lb or rb:
        return None
    return tuple(lc), tuple(rc)


def _shifted(dims):
    return tuple(d + 1 for d in dims)


def _bytes(aval):
    n = aval.nbytes
    return float("inf") if n is None else n


def _is_zero(operand):
    return type(operand) is Literal and not np.any(np.asarray(operand.value))


class _Split:
    """One scan node being split: its body's inputs by role, who makes and
    reads each body value, and the outer nodes made before and after it."""

    def __init__(self, node):
        p = node.params
        self.node = node
        # A weight gradient is traced as transpose(dot(x, g)): the product
        # in the layout of the weight is what is summed.
        self.body = fold_dot_transposes(p["body"])
        self.n_carry, self.n_xs = p["n_carry"], p["n_xs"]
        self.length = p["length"]
        ins = self.body.inputs
        self.carry_in = list(ins[:self.n_carry])
        self.x_in = list(ins[self.n_carry:self.n_carry + self.n_xs])
        self.const_in = list(ins[self.n_carry + self.n_xs:])
        self.outer = dict(zip(ins, node.inputs))  # body input -> scan operand
        self.x_operands = list(node.inputs[self.n_carry:self.n_carry + self.n_xs])
        self.before, self.after = [], []
        self.removed = set()  # body nodes (by id) that now run outside
        self.stacked = {}  # body value -> its outer stack ([length, ...])
        self.exported = []  # body values stacked as new outputs
        self.live = liveness.analyze(self.body)
        varying = set(self.carry_in) | set(self.x_in)
        for n in self.body.nodes:
            if any(v in varying for v in n.inputs if type(v) is Var):
                varying.update(n.outputs)
        self.varying = varying
        self.consts = set(self.const_in)
        self.budget = sum(_bytes(v.aval) for v in self.x_operands)
        self.budget += sum(_bytes(v.aval) for v in node.outputs[self.n_carry:])

    def producer(self, v):
        """The body node making v; None for a body input."""
        at = self.live.made_at.get(v)
        return None if at is None else self.body.nodes[at]

    def used_once(self, v):
        """Whether one operand of one body node, or one body output, is all
        that reads v."""
        return self.live.uses(v) == 1

    def affordable(self, values, stacks=()):
        """Whether stacking the per-step body `values` (those not stacked
        yet) and `stacks` (new outer stacks) keeps the new stacks within
        the budget; if so they are charged to it."""
        new = {id(v): v for v in values if v not in self.stacked and v not in self.x_in}
        cost = sum(self.length * _bytes(v.aval) for v in new.values())
        cost += sum(_bytes(a) for a in stacks)
        if cost > self.budget:
            return False
        self.budget -= cost
        return True

    def outer_node(self, primitive, inputs, params, aval, where):
        out = Var(aval)
        node = self.node
        where.append(Node(primitive, inputs, params, [out], node.source, node.stage,
                          node.ipu))
        return out

    def stack(self, v):
        """The outer [length, ...] stack of the per-step body value v."""
        if v in self.stacked:
            return self.stacked[v]
        if v in self.x_in:
            out = self.x_operands[self.x_in.index(v)]
        else:
            out = Var(ShapedArray((self.length,) + tuple(v.aval.shape), v.aval.dtype))
            self.exported.append((v, out))
        self.stacked[v] = out
        return out

    def invariant(self, v):
        """The outer operand of a loop constant (a constant input or a
        literal), or None."""
        if type(v) is Literal:
            return v
        return self.outer[v] if v in self.consts else None

    def hoist(self):
        """dot_general(x_t, w) -> a new xs operand, computed before the loop."""
        for n in self.body.nodes:
            if n.primitive is not dot_general_p or _plain_dims(n) is None:
                continue
            x, w = n.inputs
            if type(x) is not Var or x not in self.x_in or self.invariant(w) is None:
                continue
            lc, rc = _plain_dims(n)
            out = n.outputs[0]
            aval = ShapedArray((self.length,) + tuple(out.aval.shape), out.aval.dtype)
            if not self.affordable((), (aval,)):
                continue
            params = dict(n.params, dimension_numbers=((_shifted(lc), rc), ((), ())))
            stack = self.outer_node(
                dot_general_p, [self.stack(x), self.invariant(w)], params, aval,
                self.before)
            self.removed.add(id(n))
            self.x_in.append(out)
            self.x_operands.append(stack)
            self.stacked[out] = stack

    def _summed(self, v):
        """The outer sum over the steps of the per-step value v (a product
        of two per-step values, or a sum of one), or None."""
        n = self.producer(v)
        if n is None or id(n) in self.removed or not self.used_once(v):
            return None
        if n.primitive is dot_general_p and _plain_dims(n) is not None:
            a, b = n.inputs
            if not all(type(u) is Var and u in self.varying for u in (a, b)):
                return None
            if not self.affordable((a, b)):
                return None
            lc, rc = _plain_dims(n)
            params = dict(n.params, dimension_numbers=(
                ((0,) + _shifted(lc), (0,) + _shifted(rc)), ((), ())))
            return self.outer_node(dot_general_p, [self.stack(a), self.stack(b)],
                                   params, v.aval, self.after)
        if n.primitive is reduce_sum_p:
            (u,) = n.inputs
            if type(u) is not Var or u not in self.varying or not self.affordable((u,)):
                return None
            params = dict(n.params, axes=(0,) + _shifted(n.params["axes"]))
            return self.outer_node(reduce_sum_p, [self.stack(u)], params, v.aval,
                                   self.after)
        return None

    def accumulators(self):
        """{carry position: outer final value} of the carries split off."""
        finals = {}
        for k, c in enumerate(self.carry_in):
            new = self.body.outputs[k]
            n = self.producer(new)
            if (n is None or n.primitive is not add_p or not self.used_once(c)
                    or not self.used_once(new) or c not in n.inputs):
                continue
            a, b = n.inputs
            v = b if a is c else a
            if (type(v) is not Var or v is c or v.aval != c.aval
                    or new.aval != c.aval):
                continue
            total = self._summed(v)
            if total is None:
                continue
            init = self.node.inputs[k]
            if not _is_zero(init):
                total = self.outer_node(add_p, [init, total], {}, c.aval, self.after)
            self.removed.add(id(n))
            finals[k] = total
        return finals

    def sunk(self):
        """{stacked output position: outer value} of the products of a
        per-step value and a loop constant computed after the loop."""
        outs = {}
        for j, y in enumerate(self.body.outputs[self.n_carry:]):
            n = self.producer(y)
            if (type(y) is not Var or n is None or id(n) in self.removed
                    or n.primitive is not dot_general_p
                    or _plain_dims(n) is None or not self.used_once(y)):
                continue
            p, w = n.inputs
            if type(p) is not Var or p not in self.varying or self.invariant(w) is None:
                continue
            if not self.affordable((p,)):
                continue
            lc, rc = _plain_dims(n)
            params = dict(n.params, dimension_numbers=((_shifted(lc), rc), ((), ())))
            outs[j] = self.outer_node(
                dot_general_p, [self.stack(p), self.invariant(w)], params,
                ShapedArray((self.length,) + tuple(y.aval.shape), y.aval.dtype),
                self.after)
        return outs

    def rebuilt(self, finals, sunk):
        """(the new scan node, {old scan output: its replacement})."""
        nc = self.n_carry
        keep_carry = [k for k in range(nc) if k not in finals]
        n_ys = len(self.body.outputs) - nc
        keep_ys = [j for j in range(n_ys) if j not in sunk]
        body = Graph()
        body.inputs = ([self.carry_in[k] for k in keep_carry] + self.x_in
                       + self.const_in)
        body.nodes = [n for n in self.body.nodes if id(n) not in self.removed]
        body.outputs = ([self.body.outputs[k] for k in keep_carry]
                        + [self.body.outputs[nc + j] for j in keep_ys]
                        + [v for v, _ in self.exported])
        body = eliminate_dead_code(body)
        old = self.node
        operands = ([old.inputs[k] for k in keep_carry] + self.x_operands
                    + list(old.inputs[nc + self.n_xs:]))
        outputs = ([old.outputs[k] for k in keep_carry]
                   + [old.outputs[nc + j] for j in keep_ys]
                   + [out for _, out in self.exported])
        params = dict(old.params, body=body, n_carry=len(keep_carry), n_xs=len(self.x_in))
        env = {old.outputs[k]: v for k, v in finals.items()}
        env.update({old.outputs[nc + j]: v for j, v in sunk.items()})
        return copy_node(old, operands, params, outputs), env


def _split(node):
    """(outer nodes before, the scan node, outer nodes after, {old scan
    output: replacement}); the node itself when nothing splits off."""
    if node.params.get("length") is None:
        return None
    s = _Split(node)
    s.hoist()
    finals = s.accumulators()
    sunk = s.sunk()
    if not (s.removed or sunk):
        return None
    scan, env = s.rebuilt(finals, sunk)
    return s.before, scan, s.after, env


def _selects(index, start, limit, stride, dim):
    return range(*slice(start, limit, stride).indices(dim)) == range(*index)


def _last_step_reads(graph):
    """{id of a slice node: (scan node, carry position)} for the slices
    that read a scan's stacked output only at the last step the loop runs,
    where that output is also the carry (the same body value), and every
    reader of that stack is such a slice."""
    live = liveness.analyze(graph)
    found = {}
    for node in graph.nodes:
        if node.primitive is not scan_p or node.params.get("length") is None:
            continue
        p = node.params
        nc, body, length = p["n_carry"], p["body"], p["length"]
        last = (0, 1) if p["reverse"] else (length - 1, length)
        for j, y in enumerate(body.outputs[nc:]):
            if y not in body.outputs[:nc] or length < 1:
                continue
            stack = node.outputs[nc + j]
            reads = [graph.nodes[i] for i in live.readers.get(stack, ())]
            if live.last_use[stack] == live.end or not reads:
                continue
            ok = all(
                r.primitive is slice_p
                and all(st in (None, 1) for st in r.params["strides"])
                and _selects(last, r.params["start_indices"][0],
                             r.params["limit_indices"][0], 1, length)
                and all(_selects((0, d), a, b, 1, d) for a, b, d in zip(
                    r.params["start_indices"][1:], r.params["limit_indices"][1:],
                    stack.aval.shape[1:]))
                for r in reads)
            if ok:
                k = body.outputs[:nc].index(y)
                found.update({id(r): (node, k) for r in reads})
    return found


def split_scans(graph):
    """`graph` with each scan's splittable products outside its loop, in
    its sub-graphs too."""
    nodes, env, changed = [], {}, False
    last_step = _last_step_reads(graph)
    finals = {}  # id of a scan node (as it was) -> its carry outputs
    for node in graph.nodes:
        read = last_step.get(id(node))
        if read is not None:
            scan, k = read
            final = substitute(finals[id(scan)][k], env)
            nodes.append(copy_node(node, [final], {"new_shape": node.outputs[0].aval.shape},
                                   primitive=reshape_p))
            changed = True
            continue
        if node.primitive is scan_p:
            finals[id(node)] = node.outputs[:node.params["n_carry"]]
        if env:
            node = copy_node(node, [substitute(v, env) for v in node.inputs])
        if node.primitive.subgraph_params:
            # Bodies are split here too, not only when compiled: an engine
            # emitting this graph (the graph runtime, XLA) runs the scans
            # nested in the device loop from these bodies.
            params = map_subgraphs(node, split_scans)
            if any(params[k] is not node.params[k] for k in node.primitive.subgraph_params):
                node = copy_node(node, node.inputs, params)
                changed = True
        split = _split(node) if node.primitive is scan_p else None
        if split is None:
            nodes.append(node)
            continue
        before, scan, after, replaced = split
        nodes += before + [scan] + after
        env.update(replaced)
        changed = True
    if not changed:
        return graph
    # The split bodies no longer read some operands, nor the outer program
    # some stacked outputs.
    return eliminate_dead_code(rebuilt(graph, nodes, env))
