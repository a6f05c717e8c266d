"""Sums of zero-padded pieces that tile an array become a concatenate.

The gradient of slicing an array into pieces (an LSTM's four gates, a
split) is one zero-padded array per piece, added up: k full-size arrays
filled with zeros, k copies and k - 1 full-size additions, where one
concatenate of the pieces gives the same values (x + 0 is x; only the
sign of a zero can differ).

A sum qualifies when every addend is a zero pad (no interior or negative
padding) or another such sum, each read only there, and the pieces cover
the result exactly once, side by side along one axis.
"""

import numpy as np

from keras_ipu.device import liveness
from keras_ipu.device.compiler.graph_utils import copy_node
from keras_ipu.device.compiler.graph_utils import rebuilt
from keras_ipu.device.ir import Literal
from keras_ipu.device.ir import Var
from keras_ipu.device.primitives.structure import concatenate_p


def _is_zero(operand):
    if type(operand) is not Literal:
        return False
    value = np.asarray(operand.value)
    return value.size == 1 and bool(value == 0)


def _tiling_axis(pieces, shape):
    """The axis along which the pieces (x, lows) lie side by side covering
    `shape` exactly, or None."""
    ndim = len(shape)
    for axis in range(ndim):
        full_elsewhere = all(
            lows[d] == 0 and x.aval.shape[d] == shape[d]
            for x, lows in pieces
            for d in range(ndim)
            if d != axis
        )
        if not full_elsewhere:
            continue
        spans = sorted((lows[axis], x.aval.shape[axis]) for x, lows in pieces)
        at = 0
        for lo, size in spans:
            if lo != at or size <= 0:
                break
            at += size
        else:
            if at == shape[axis]:
                return axis
    return None


def concatenate_padded_sums(graph):
    live = liveness.analyze(graph)

    def private(v):
        return type(v) is Var and live.read_once(v)

    def pieces_of(v, aval, used):
        """[(x, lows)] of the zero pads summed into v, or None; `used`
        collects the nodes that would go."""
        i = live.made_at.get(v)
        if i is None or not private(v):
            return None
        node = graph.nodes[i]
        name = node.primitive.name
        if name == "pad":
            x, value = node.inputs
            config = node.params["config"]
            if not _is_zero(value) or any(
                lo < 0 or hi < 0 or it != 0 for lo, hi, it in config
            ):
                return None
            used.add(i)
            return [(x, tuple(lo for lo, _, _ in config))]
        if name == "add" and node.outputs[0].aval == aval:
            found = []
            for operand in node.inputs:
                sub = pieces_of(operand, aval, used)
                if sub is None:
                    return None
                found += sub
            used.add(i)
            return found
        return None

    replaced, dropped = {}, set()
    for i, node in enumerate(graph.nodes):
        if node.primitive.name != "add" or i in dropped:
            continue
        aval = node.outputs[0].aval
        if not aval.is_static() or aval.ndim == 0:
            continue
        used = set()
        pieces = []
        for operand in node.inputs:
            sub = pieces_of(operand, aval, used)
            if sub is None:
                break
            pieces += sub
        else:
            if any(x.aval.dtype != aval.dtype for x, _ in pieces):
                continue
            axis = _tiling_axis(pieces, aval.shape)
            if axis is None:
                continue
            pieces.sort(key=lambda p: p[1][axis])
            replaced[i] = copy_node(node, [x for x, _ in pieces], {"axis": axis},
                                    primitive=concatenate_p)
            dropped |= used
    if not replaced:
        return graph
    nodes = [
        replaced.get(i, node)
        for i, node in enumerate(graph.nodes)
        if i not in dropped
    ]
    return rebuilt(graph, nodes, {})
