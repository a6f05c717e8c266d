"""Folding a transpose of a matrix product into the product.

Autodiff of `x @ w` gives the weight gradient as dot_general(x, g)
contracting the batch, followed by a transpose to w's layout. On the host
the transpose is a strided view: every elementwise op that reads it later
(the optimizer update) walks memory against the grain, and the new weights
inherit that layout. (a·b)ᵀ = bᵀ·aᵀ: swapping the operands gives the
transposed product directly, contiguous, for the price of the product.

Applies when the transpose is the product's only reader and its
permutation moves the rhs free dims ahead of the lhs free dims (batch dims
stay first), i.e. exactly the output layout of the swapped product.
"""

from keras_ipu.device import liveness
from keras_ipu.device.compiler.graph_utils import copy_node
from keras_ipu.device.compiler.graph_utils import rebuilt
from keras_ipu.device.primitives.dot import split_dimensions


def _swapped_dims(node, permutation):
    """The dimension numbers of the swapped product, or None."""
    lhs, rhs = node.inputs
    if lhs.aval.dtype != rhs.aval.dtype:
        return None  # the accumulation dtype follows the lhs
    dims = node.params["dimension_numbers"]
    lc, rc, lb, rb, lf, rf = split_dimensions(lhs.aval.ndim, rhs.aval.ndim, dims)
    nb, nl, nr = len(lb), len(lf), len(rf)
    if nl == 0 or nr == 0:
        return None
    expected = (
        tuple(range(nb))
        + tuple(range(nb + nl, nb + nl + nr))
        + tuple(range(nb, nb + nl))
    )
    if tuple(permutation) != expected:
        return None
    return ((tuple(rc), tuple(lc)), (tuple(rb), tuple(lb)))


def fold_dot_transposes(graph):
    live = liveness.analyze(graph)

    replaced = {}  # index of a folded transpose -> its new product node
    dropped = set()  # indices of products folded into a later transpose
    for i, node in enumerate(graph.nodes):
        if node.primitive.name != "transpose":
            continue
        (x,) = node.inputs
        j = live.made_at.get(x)
        if j is None or j in dropped:
            continue
        dot = graph.nodes[j]
        if (
            dot.primitive.name != "dot_general"
            or not live.read_once(x)
        ):
            continue
        dims = _swapped_dims(dot, node.params["permutation"])
        if dims is None:
            continue
        params = dict(dot.params, dimension_numbers=dims)
        lhs, rhs = dot.inputs
        replaced[i] = copy_node(node, [rhs, lhs], params, primitive=dot.primitive)
        replaced[i].source = node.source or dot.source
        dropped.add(j)
    if not replaced:
        return graph
    # The product moves down to where the transpose stood: its operands
    # exist there too, and nothing else read it.
    nodes = []
    for i, node in enumerate(graph.nodes):
        if i in dropped:
            continue
        nodes.append(replaced.get(i, node))
    return rebuilt(graph, nodes, {})
