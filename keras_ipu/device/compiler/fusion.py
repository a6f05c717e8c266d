"""Fusion of elementwise chains into one node, like XLA's loop fusion.

Grouping: elementwise nodes with the same output shape join the group of a
producer of one of their operands. The fused node is emitted where the
group's *anchor* (its last member so far) stood, so a join must keep the
program valid: a node whose other operands all exist before the anchor is
hoisted into the group; otherwise the anchor moves down to the node, which
is only allowed while no outside node has read a value of the group yet
(the group is not *sealed*).

Kernel: the chain is turned into a small Python function (generated source,
readable in `str(executable)`) that calls NumPy ufuncs, passing `out=` to
write a result into a temporary of the chain that just died (same shape and
dtype, made by an earlier ufunc of the chain, not an output): a chain of k
ops allocates about one buffer instead of k.
"""

import numpy as np

from keras_ipu.device import autodiff
from keras_ipu.device import liveness
from keras_ipu.device.compiler.broadcast_operands import read_broadcast_operands
from keras_ipu.device.compiler.donation import donatable_operands
from keras_ipu.device.compiler.dot_transpose import fold_dot_transposes
from keras_ipu.device.compiler.graph_utils import copy_node
from keras_ipu.device.compiler.graph_utils import rebuilt
from keras_ipu.device.compiler.pad_sums import concatenate_padded_sums
from keras_ipu.device.compiler.lowering import ALIGNED_OUTPUT_LOWERINGS
from keras_ipu.device.compiler.lowering import LOWERINGS
from keras_ipu.device.compiler.lowering import fast_kernel
from keras_ipu.device.compiler.lowering import fast_ufunc
from keras_ipu.device.compiler.native_fusion import native_kernel
from keras_ipu.device.ir import Graph
from keras_ipu.device.ir import Node
from keras_ipu.device.ir import ShapedArray
from keras_ipu.device.ir import Var
from keras_ipu.device.primitives import cost_util
from keras_ipu.device.primitives.registry import Primitive


# -- the fused primitive ---------------------------------------------------
# params: chain = ((primitive, params_items, refs, out_aval), ...), where a
# ref is ("in", i, aval) for operand i of the fused node or ("t", j, aval)
# for step j's result; results = indices of the steps that are the node's
# outputs, in the order of its output Vars.


def _fused_rule(*avals, chain, results):
    return tuple(chain[j][3] for j in results)


def _fused_kernel(*xs, chain, results):
    # Eager path (the interpreter): build the kernel and run it once.
    return build_fused_kernel(chain, results, len(xs))(*xs)


fused_elementwise_p = Primitive(
    "fused_elementwise",
    _fused_rule,
    _fused_kernel,
    multiple_results=True,
    elementwise=True,
    fp_class="fused",
    doc="A chain of elementwise primitives run as one kernel.",
)


def unfused_graph(chain, results, in_avals):
    """The chain as a plain Graph of its primitives (inputs: the fused
    node's operands; outputs: its results)."""
    graph = Graph()
    graph.inputs = [Var(a) for a in in_avals]
    temps = []
    for prim, params_items, refs, aval in chain:
        operands = [graph.inputs[k] if kind == "in" else temps[k] for kind, k, _ in refs]
        out = Var(aval)
        graph.nodes.append(Node(prim, operands, dict(params_items), [out]))
        temps.append(out)
    graph.outputs = [temps[j] for j in results]
    return graph


def _fused_grad(cts, inputs, outputs, *, chain, results):
    # Fusion runs after autodiff in the compiler, but an optimized graph
    # can still be differentiated: through the chain's own primitives.
    avals = [ShapedArray(x.shape, x.dtype) for x in inputs]
    return autodiff.graph_vjp(unfused_graph(chain, results, avals), list(inputs), cts)


fused_elementwise_p.grad = _fused_grad


def _fused_cost(ins, outs, *, chain, results, donate=()):
    """A fused chain is one elementwise compute set: the work of its members,
    reading the fused node's operands and writing its results once."""
    flops = 0
    for prim, params_items, refs, aval in chain:
        c = prim.cost(tuple(r[2] for r in refs), (aval,), **dict(params_items))
        flops += c.flops
    return cost_util.make(ins, outs, "elementwise", flops)


fused_elementwise_p.cost = _fused_cost


def _plan_buffers(chain, results, ufuncs, donate=()):
    """For each step, the buffer its ufunc writes into (`out=`), or None.

    A buffer is ("t", j), step j's result, or ("in", k), operand k of the
    fused node when it is donated (the program's last use of a fresh array
    nobody else holds). A step writes into an owned buffer with its own
    aval that died: one of its operands dying at this step, else one that
    died earlier. Outputs of the chain are never overwritten.
    """
    aval_of = {}
    for _, _, refs, _ in chain:
        for kind, k, aval in refs:
            aval_of[(kind, k)] = aval
    n_in = 1 + max((k for kind, k in aval_of if kind == "in"), default=-1)
    in_avals = [aval_of.get(("in", k)) for k in range(n_in)]
    steps = unfused_graph(chain, results, in_avals)
    last_use = liveness.analyze(steps).last_use
    last_read = {("in", k): last_use[v] for k, v in enumerate(steps.inputs)}
    last_read.update({("t", j): last_use[node.outputs[0]]
                      for j, node in enumerate(steps.nodes)})
    outputs = {("t", j) for j in results}
    # A same-dtype convert returns its operand itself: that buffer lives on
    # in the convert's result and is never overwritten.
    aliased = {
        refs[0][:2] for prim, _, refs, aval in chain
        if prim.name == "convert_element_type" and refs[0][2].dtype == aval.dtype
    }
    owned = {("in", k) for k in donate} - aliased
    pool = {}  # aval -> dead owned buffers
    reuse = []
    for j, (_, _, refs, aval) in enumerate(chain):
        choice = None
        dying = [
            (kind, k) for kind, k, _ in refs
            if last_read[(kind, k)] == j
            and (kind, k) in owned
            and (kind, k) not in outputs
        ]
        if ufuncs[j] is not None and aval.ndim > 0:
            for key in dying:
                if aval_of[key] == aval:
                    choice = key
                    break
            if choice is None and pool.get(aval):
                choice = pool[aval].pop()
            if ("t", j) not in aliased:
                owned.add(("t", j))
        for key in dict.fromkeys(dying):
            owned.discard(key)
            # Another kernel's result may alias its operand (a same-dtype
            # convert returns it): such a buffer is never reused.
            if key != choice and ufuncs[j] is not None:
                pool.setdefault(aval_of[key], []).append(key)
        reuse.append(choice)
    return reuse


def _bound_kernel(prim, params_items):
    params = dict(params_items)
    kernel = prim.kernel
    if not params:
        return kernel
    return lambda *xs: kernel(*xs, **params)


def _integral_float_to_int(source, float_dtype, dtype):
    """The conversion to int `dtype` of `float_dtype` (float32 or float64)
    values converted from the integer dtype `source` earlier in the chain
    (Keras' labels: int32 -> float32 -> int32). They are integral and
    never NaN, so of the convert
    kernel's rules (convert.py: truncation, NaN to 0, saturation) only the
    saturation can apply, and only where `source`'s bounds, rounded to the
    float (2**31 - 1 becomes 2**31 in float32), pass `dtype`'s. The same
    values as the convert kernel without its trunc, min and max: tens of
    microseconds per step on a cache a large product has just swept."""
    have, want = np.iinfo(source), np.iinfo(dtype)
    # Integral values pass the target's bounds from these on: powers of two
    # (or 0), exact in float32 and float64, so comparing the float operand
    # with them rounds nothing.
    above, below = float(want.max) + 1.0, float(want.min)
    rounded = np.array([have.min, have.max]).astype(float_dtype)
    low, high = float(rounded[0]) < below, float(rounded[1]) >= above
    putmask = np.putmask

    def convert(v):
        out = v.astype(dtype)
        if high:
            putmask(out, v >= above, want.max)
        if low:
            putmask(out, v < below, want.min)
        return out

    return convert


def _from_integers(chain, j):
    """(integer dtype, float dtype) of chain step j's float operand, where
    step j converts it to an integer dtype and the step before made it
    from that integer dtype; else None."""
    prim, _, refs, aval = chain[j]
    if prim.name != "convert_element_type" or aval.dtype.kind not in "iu":
        return None
    kind, k, operand = refs[0]
    if kind != "t" or operand.dtype not in (np.dtype(np.float32), np.dtype(np.float64)):
        return None
    before, _, before_refs, _ = chain[k]
    source = before_refs[0][2].dtype
    if before.name != "convert_element_type" or source.kind not in "iu":
        return None
    return source, operand.dtype


def fused_source(chain, results, n_inputs, donate=()):
    """The generated source of the fused kernel, and its namespace.
    `donate`: operands the kernel may overwrite (see _plan_buffers)."""
    namespace = {"_errstate": np.errstate, "_asarray": np.asarray}
    ufuncs = [
        fast_ufunc(prim, [r[2] for r in refs], aval)
        for prim, _, refs, aval in chain
    ]
    reuse = _plan_buffers(chain, results, ufuncs, donate)
    args = ", ".join(f"x{i}" for i in range(n_inputs))
    lines = [f"def fused({args}):", "    with _errstate(all='ignore'):"]
    for j, (prim, params_items, refs, aval) in enumerate(chain):
        operands = ", ".join(
            f"x{k}" if kind == "in" else f"t{k}" for kind, k, _ in refs
        )
        if ufuncs[j] is not None:
            name = f"_{ufuncs[j].__name__}"
            namespace[name] = ufuncs[j]
            out = ""
            if reuse[j] is not None:
                kind, k = reuse[j]
                out = f", out={'x' if kind == 'in' else 't'}{k}"
            lines.append(f"        t{j} = {name}({operands}{out})  # {prim.name}")
        else:
            name = f"_k{j}"
            source = _from_integers(chain, j)
            fast = (_integral_float_to_int(*source, aval.dtype) if source is not None
                    else fast_kernel(prim, [r[2] for r in refs], aval))
            namespace[name] = fast or _bound_kernel(prim, params_items)
            lines.append(f"        t{j} = {name}({operands})  # {prim.name}")
    outs = "".join(
        (f"_asarray(t{j}), " if chain[j][3].ndim == 0 else f"t{j}, ")
        for j in results
    )
    lines.append(f"    return ({outs.rstrip()})")
    return "\n".join(lines), namespace


def build_fused_kernel(chain, results, n_inputs, donate=()):
    source, namespace = fused_source(chain, results, n_inputs, donate)
    exec(compile(source, "<fused_elementwise>", "exec"), namespace)  # noqa: S102
    fn = namespace["fused"]
    fn.source = source
    return fn


def _lower_fused(params, in_avals, out_avals):
    # Donation only in a compiled program, whose liveness it was planned
    # with; the eager kernel above never writes into its operands.
    chain, results, donate = params["chain"], params["results"], params.get("donate", ())
    kernel = build_fused_kernel(chain, results, len(in_avals), donate)
    aligned = params.get("aligned_outputs", ())
    streamed = params.get("streamed_outputs", ())
    return native_kernel(chain, results, in_avals, donate, kernel, aligned, streamed) or kernel


LOWERINGS["fused_elementwise"] = _lower_fused
ALIGNED_OUTPUT_LOWERINGS.add("fused_elementwise")


# -- the pass ----------------------------------------------------------------


class _Group:
    __slots__ = ("members", "anchor", "sealed", "shape")

    def __init__(self, index, shape):
        self.members = [index]
        self.anchor = index
        self.sealed = False
        self.shape = shape


def _fusible(node):
    return (
        node.primitive.elementwise
        and not node.primitive.multiple_results
        and node.outputs[0].aval.is_static()
    )


def fuse_elementwise(graph, donated_inputs=()):
    """`donated_inputs`: positions of graph inputs the caller gives up
    (donation.py); fused chains may write into them."""
    # Products fused with the transpose that follows them first: the
    # elementwise chains then read contiguous arrays.
    graph = fold_dot_transposes(graph)
    # Sums of zero-padded pieces (slice gradients) first, or they would
    # become fused chains of full-size additions.
    graph = concatenate_padded_sums(graph)
    # Broadcasts the chains' own broadcasting does: fewer kernels, and C
    # chains that read a column in place rather than a copy of its view.
    graph = read_broadcast_operands(graph)
    nodes = graph.nodes
    live = liveness.analyze(graph)
    producer = live.made_at
    group_of = {}  # node index -> _Group

    def defined_at(var):
        i = producer.get(var)
        if i is None:
            return -1  # a graph input
        g = group_of.get(i)
        return g.anchor if g is not None else i

    for i, node in enumerate(nodes):
        vars_in = [v for v in node.inputs if type(v) is Var]
        joined = None
        if _fusible(node):
            # A chain keeps one shape, on one IPU.
            shape = (node.outputs[0].aval.shape, node.ipu)
            for v in vars_in:
                g = group_of.get(producer.get(v))
                if g is None or g.shape != shape or g is joined:
                    continue
                outside = [
                    u for u in vars_in if group_of.get(producer.get(u)) is not g
                ]
                if all(defined_at(u) < g.anchor for u in outside):
                    joined = g  # hoisted to the anchor
                elif not g.sealed:
                    joined = g
                    g.anchor = i
                if joined is not None:
                    break
        if joined is not None:
            # Another group this node reads can come along (a chain fed by
            # two chains, as `m * 0.9 - lr * g`) if it can move down to the
            # anchor: nothing outside it has read its values yet.
            for v in vars_in:
                h = group_of.get(producer.get(v))
                if (
                    h is None
                    or h is joined
                    or h.sealed
                    or h.shape != joined.shape
                    or h.anchor > joined.anchor
                ):
                    continue
                for m in h.members:
                    group_of[m] = joined
                joined.members.extend(h.members)
        # Values of other groups read here are read from outside them.
        for v in vars_in:
            g = group_of.get(producer.get(v))
            if g is not None and g is not joined:
                g.sealed = True
        if joined is not None:
            joined.members.append(i)
            group_of[i] = joined
        elif _fusible(node):
            group_of[i] = _Group(i, (node.outputs[0].aval.shape, node.ipu))

    return _emit(graph, group_of, live, donated_inputs)


def _emit(graph, group_of, live, donated_inputs):
    nodes = graph.nodes
    # Var -> groups of its readers (None: a reader not fused)
    readers_outside = {
        v: {group_of.get(i) for i in readers} for v, readers in live.readers.items()
    }
    graph_outputs = {v for v in graph.outputs if type(v) is Var}

    new_nodes = []
    done = set()
    for i, node in enumerate(nodes):
        g = group_of.get(i)
        if g is None or len(g.members) == 1:
            new_nodes.append(node)
            continue
        if i != g.anchor or id(g) in done:
            continue
        done.add(id(g))
        new_nodes.append(_fused_node(nodes, g, readers_outside, graph_outputs))
    return _with_donations(rebuilt(graph, new_nodes, {}), donated_inputs)


def _with_donations(graph, donated_inputs):
    """`graph` with its fused nodes annotated with the operands they may
    overwrite (see donation.py)."""
    donate = donatable_operands(graph, donated_inputs)
    nodes = []
    for i, node in enumerate(graph.nodes):
        if node.primitive is fused_elementwise_p and i in donate:
            node = copy_node(node, node.inputs, dict(node.params, donate=donate[i]))
        nodes.append(node)
    return rebuilt(graph, nodes, {})


def _fused_node(nodes, group, readers_outside, graph_outputs):
    members = sorted(group.members)
    step_of = {}  # Var -> step index
    operands = []  # the fused node's inputs (Vars and Literals)
    operand_index = {}
    chain = []
    for j, i in enumerate(members):
        node = nodes[i]
        refs = []
        for v in node.inputs:
            if type(v) is Var and v in step_of:
                refs.append(("t", step_of[v], v.aval))
                continue
            key = v if type(v) is Var else ("literal", id(v))
            if key not in operand_index:
                operand_index[key] = len(operands)
                operands.append(v)
            refs.append(("in", operand_index[key], v.aval))
        out = node.outputs[0]
        chain.append(
            (node.primitive, tuple(sorted(node.params.items())), tuple(refs), out.aval)
        )
        step_of[out] = j
    results, outputs = [], []
    for j, i in enumerate(members):
        out = nodes[i].outputs[0]
        read_outside = any(r is not group for r in readers_outside.get(out, ()))
        if read_outside or out in graph_outputs:
            results.append(j)
            outputs.append(out)
    params = {"chain": tuple(chain), "results": tuple(results)}
    source = "+".join(nodes[i].source for i in members if nodes[i].source)
    first = nodes[members[0]]  # every member runs where the first does
    return Node(fused_elementwise_p, operands, params, outputs, source or None,
                first.stage, first.ipu)
