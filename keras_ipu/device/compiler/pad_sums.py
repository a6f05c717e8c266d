"""Sums of zero-padded pieces that tile an array become a concatenate.

The gradient of slicing an array into pieces (an LSTM's four gates, a
split) is one zero-padded array per piece, added up: k full-size arrays
filled with zeros, k copies and k - 1 full-size additions, where one
concatenate of the pieces gives the same values (x + 0 is x; only the
sign of a zero can differ).

A sum qualifies when every addend is a zero pad (no negative padding) or
another such sum, each read only there, and the pieces cover the result
exactly once: side by side along one axis (no interior padding), or
interleaved (a max pool's gradient: the window position (a, b) of a 2x2
pool with stride 2 gives a pad with interior padding 1 starting at row a,
column b; the four pads together fill every element once). Interleaved
pieces become concatenates along inserted axes of one element each, and
a reshape: out[.., i*s + a, ..] = piece_a[.., i, ..].
"""

import numpy as np

from keras_ipu.device import liveness
from keras_ipu.device.compiler.graph_utils import copy_node
from keras_ipu.device.compiler.graph_utils import is_literal_of
from keras_ipu.device.compiler.graph_utils import rebuilt
from keras_ipu.device.ir import ShapedArray
from keras_ipu.device.ir import Var
from keras_ipu.device.primitives.structure import concatenate_p
from keras_ipu.device.primitives.structure import reshape_p


def _is_zero(operand):
    return is_literal_of(operand, 0)


def _tiling_axis(pieces, shape):
    """The axis along which the pieces (x, config) lie side by side covering
    `shape` exactly, or None."""
    if any(it != 0 for _, config in pieces for _, _, it in config):
        return None
    pieces = [(x, tuple(lo for lo, _, _ in config)) for x, config in pieces]
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


def _interleaving(pieces, shape):
    """The strides (interior padding + 1, per axis) when the pieces (x,
    config), all of one shape, interleave to cover `shape` exactly once:
    along each strided axis a piece starts at its own offset below the
    stride, every combination of offsets once; else None."""
    first = pieces[0][1]
    strides = tuple(it + 1 for _, _, it in first)
    m = tuple(pieces[0][0].aval.shape)
    if max(strides) == 1 or any(
        tuple(x.aval.shape) != m or tuple(it for _, _, it in config) != tuple(
            st - 1 for st in strides)
        for x, config in pieces
    ):
        return None
    offsets = set()
    for _, config in pieces:
        for (lo, hi, _), st, size, full in zip(config, strides, m, shape):
            if st == 1 and (lo, hi) != (0, 0) or not 0 <= lo < st or size * st != full:
                return None
        offsets.add(tuple(lo for (lo, _, _), st in zip(config, strides) if st > 1))
    count = int(np.prod([st for st in strides if st > 1]))
    return strides if len(offsets) == len(pieces) == count else None


def _interleave_nodes(node, pieces, strides):
    """Nodes computing `node`'s result from the interleaved pieces: each
    reshaped with an axis of one element after every strided axis, these
    concatenated along those axes (the last strided axis first, in order
    of offset), and reshaped to the result."""
    out = node.outputs[0]
    dtype = out.aval.dtype
    m = tuple(pieces[0][0].aval.shape)
    split, inserted = [], {}
    for d, (size, st) in enumerate(zip(m, strides)):
        split.append(size)
        if st > 1:
            inserted[d] = len(split)
            split.append(1)
    strided = [d for d, st in enumerate(strides) if st > 1]
    pieces = sorted(pieces, key=lambda p: tuple(p[1][d][0] for d in strided))
    nodes = []

    def emit(primitive, inputs, params, shape, output=None):
        output = output or Var(ShapedArray(tuple(shape), dtype))
        nodes.append(copy_node(node, inputs, params, [output], primitive))
        return output

    level = [emit(reshape_p, [x], {"new_shape": tuple(split)}, split) for x, _ in pieces]
    for d in reversed(strided):
        split[inserted[d]] = strides[d]
        st = strides[d]
        level = [
            emit(concatenate_p, level[j:j + st], {"axis": inserted[d]}, split)
            for j in range(0, len(level), st)
        ]
    emit(reshape_p, level, {"new_shape": tuple(out.aval.shape)}, out.aval.shape, out)
    return nodes


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
            config = tuple(node.params["config"])
            if not _is_zero(value) or any(lo < 0 or hi < 0 for lo, hi, _ in config):
                return None
            used.add(i)
            return [(x, config)]
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
            if axis is not None:
                pieces.sort(key=lambda p: p[1][axis][0])
                replaced[i] = [copy_node(node, [x for x, _ in pieces], {"axis": axis},
                                         primitive=concatenate_p)]
                dropped |= used
                continue
            strides = _interleaving(pieces, aval.shape)
            if strides is not None:
                replaced[i] = _interleave_nodes(node, pieces, strides)
                dropped |= used
    if not replaced:
        return graph
    nodes = [
        new
        for i, node in enumerate(graph.nodes)
        if i not in dropped
        for new in replaced.get(i, [node])
    ]
    return rebuilt(graph, nodes, {})
