"""Dead-code elimination: drop nodes none of whose outputs are used.

Every primitive is pure (random numbers come from explicit keys), so an
unused node has no effect to keep.

Scans are pruned inside too: a stacked output (ys) nobody reads is dropped
from the body, and an xs or constant operand the (pruned) body no longer
reads is dropped from the scan. Autodiff saves every residual the backward
scan might need; the ones it does not read would otherwise be computed,
copied into a [length, ...] stack each iteration, and passed back in.
"""

from keras_ipu.device.compiler.graph_utils import copy_node
from keras_ipu.device.compiler.graph_utils import rebuilt
from keras_ipu.device.ir import Graph
from keras_ipu.device.ir import Var
from keras_ipu.device.primitives.control_flow import scan_p


def _prune_scan(node, live):
    params = node.params
    body, n_carry, n_xs = params["body"], params["n_carry"], params["n_xs"]
    keep_out = [
        i for i, v in enumerate(node.outputs) if i < n_carry or v in live
    ]
    pruned = Graph()
    pruned.inputs = list(body.inputs)
    pruned.nodes = list(body.nodes)
    pruned.outputs = [body.outputs[i] for i in keep_out]
    pruned = eliminate_dead_code(pruned)
    read = {v for n in pruned.nodes for v in n.inputs if type(v) is Var}
    read.update(v for v in pruned.outputs if type(v) is Var)
    # The carry always stays (its inputs and outputs pair up by position).
    keep_in = [
        i for i, v in enumerate(body.inputs) if i < n_carry or v in read
    ]
    if len(keep_out) == len(node.outputs) and len(keep_in) == len(node.inputs):
        return node
    pruned.inputs = [body.inputs[i] for i in keep_in]
    new_n_xs = sum(1 for i in keep_in if n_carry <= i < n_carry + n_xs)
    new_params = dict(params, body=pruned, n_xs=new_n_xs)
    return copy_node(node, [node.inputs[i] for i in keep_in], new_params,
                     [node.outputs[i] for i in keep_out])


# Primitives whose sub-graphs are pruned of what their unused outputs need:
# prune(node, live) -> node (as JAX keeps dce_rules per primitive).
_PRUNE_INSIDE = {scan_p: _prune_scan}


def eliminate_dead_code(graph):
    live = {v for v in graph.outputs if type(v) is Var}
    kept = []
    for node in reversed(graph.nodes):
        if any(out in live for out in node.outputs):
            prune = _PRUNE_INSIDE.get(node.primitive)
            if prune is not None:
                node = prune(node, live)
            kept.append(node)
            live.update(v for v in node.inputs if type(v) is Var)
    kept.reverse()
    return rebuilt(graph, kept, {})
