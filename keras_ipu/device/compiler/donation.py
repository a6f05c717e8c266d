"""Donation: which operands a kernel may overwrite.

A kernel may write its result into an operand's buffer when the program
owns that buffer and nothing reads it afterwards: XLA's buffer donation.
The program owns
- the arrays its own kernels allocated (`fresh_outputs`: a product, a
  ufunc's result; never a view of something else),
- the inputs its caller donated (`donated_inputs`, e.g. the trainer's
  weights and optimizer state, which the step replaces: the caller gives
  them up, as with jax.jit's donate_argnums).
Such a value may be overwritten by the node that reads it last, provided
it is not a program output and no earlier reader made a view of it (every
earlier reader allocated its results).

fusion.py annotates fused chains with the operands they may write into
(`donate`); the Executable tells a scan which of its initial carries it
owns, so the loop body can update them in place.
"""

from keras_ipu.device import liveness
from keras_ipu.device.compiler.lowering import fast_ufunc

# Primitives whose lowered kernel always returns a new array.
_ALLOCATING = ("dot_general",)


def fresh_outputs(node):
    """The outputs of `node` that are new arrays its kernel allocated (no
    view of anything else), as the lowered kernels compute them."""
    prim = node.primitive
    if prim.name in _ALLOCATING:
        return set(node.outputs)
    if prim.name == "fused_elementwise":
        chain, results = node.params["chain"], node.params["results"]
        fresh = set()
        for out, j in zip(node.outputs, results):
            step_prim, _, refs, aval = chain[j]
            if aval.ndim > 0 and fast_ufunc(step_prim, [r[2] for r in refs], aval):
                fresh.add(out)
        return fresh
    if prim.elementwise and not prim.multiple_results:
        aval = node.outputs[0].aval
        if aval.ndim > 0 and fast_ufunc(prim, [v.aval for v in node.inputs], aval):
            return set(node.outputs)
    return set()


def owned_values(graph, donated_inputs=()):
    """The values whose buffers the program owns: the donated inputs and
    every result a kernel allocated."""
    owned = {graph.inputs[k] for k in donated_inputs}
    for node in graph.nodes:
        owned |= fresh_outputs(node)
    return owned


def donatable_operands(graph, donated_inputs=(), owned=None, live=None):
    """{node index: operand positions that node may overwrite}.

    `donated_inputs`: positions in `graph.inputs` the caller gives up;
    `owned`: owned_values(...) and `live`: liveness.analyze(graph) when the
    caller has them already.
    """
    if owned is None:
        owned = owned_values(graph, donated_inputs)
    live = live or liveness.analyze(graph)
    nodes = graph.nodes
    allocates = [all(v in owned for v in node.outputs) for node in nodes]
    result = {}
    for i, node in enumerate(nodes):
        positions = []
        for k, v in enumerate(node.inputs):
            if (
                v in owned
                and v.aval.ndim > 0
                and live.last_use[v] == i  # its last reader (no program output)
                and node.inputs.count(v) == 1
                and all(allocates[r] for r in live.readers[v] if r != i)
            ):
                positions.append(k)
        if positions:
            result[i] = tuple(positions)
    return result
