"""Elementwise steps read a broadcast's operand instead of the broadcast.

Autodiff of a sum over trailing axes broadcasts the cotangent back
(broadcast_to of a (128, 1) column to (128, 10): sparse categorical
cross-entropy's gradient) for an elementwise step that multiplies it with
a full-size value. NumPy's ufuncs broadcast their operands themselves, and
the C chains read a scalar, a repeated row or a repeated column in place
(native_fusion.py), so the broadcast_to kernel (np.broadcast_to: a view,
but a call of a few microseconds, tens on a cold cache after a large
product) is one kernel more per step, and the C chain that reads its view
(zero strides) copies it first.

So an elementwise arithmetic, comparison, boolean or select step whose
operand is a broadcast_to's result reads the broadcast's operand instead,
where its other operands still give its own shape (the same values, NumPy's
broadcasting rule). A broadcast no step reads any more is dropped. Runs in
fuse_elementwise, before the chains are grouped.
"""

from keras_ipu.device import liveness
from keras_ipu.device.compiler.graph_utils import copy_node
from keras_ipu.device.compiler.graph_utils import rebuilt
from keras_ipu.device.ir import Var
from keras_ipu.device.primitives import elementwise as ew
from keras_ipu.device.primitives.shape_rules import ShapeError
from keras_ipu.device.primitives.shape_rules import broadcast_shapes

# Steps whose kernels (NumPy's ufuncs, np.where and the bitwise select,
# the C chains' opcodes) broadcast their operands as NumPy does.
_BROADCASTING = frozenset((
    ew.add_p, ew.sub_p, ew.mul_p, ew.div_p, ew.max_p, ew.min_p,
    ew.gt_p, ew.ge_p, ew.lt_p, ew.le_p, ew.eq_p, ew.ne_p,
    ew.and_p, ew.or_p, ew.xor_p, ew.select_p,
))


def read_broadcast_operands(graph):
    """`graph` with broadcasts read through (module doc)."""
    live = liveness.analyze(graph)
    nodes = list(graph.nodes)
    changed = set()
    for i, node in enumerate(nodes):
        if node.primitive not in _BROADCASTING or not node.outputs[0].aval.is_static():
            continue
        inputs = list(node.inputs)
        for k, v in enumerate(inputs):
            j = live.made_at.get(v) if type(v) is Var else None
            if j is None or nodes[j].primitive.name != "broadcast_to":
                continue
            source = nodes[j].inputs[0]
            if (nodes[j].ipu != node.ipu or source.aval.dtype != v.aval.dtype
                    or not source.aval.is_static()):
                continue
            shapes = [tuple(u.aval.shape) for u in inputs]
            shapes[k] = tuple(source.aval.shape)
            try:
                if broadcast_shapes(*shapes) != tuple(node.outputs[0].aval.shape):
                    continue
            except ShapeError:
                continue
            inputs[k] = source
        if inputs != list(node.inputs):
            nodes[i] = copy_node(node, inputs)
            changed.add(i)
    if not changed:
        return graph
    read = {v for node in nodes for v in node.inputs if type(v) is Var}
    read |= {v for v in graph.outputs if type(v) is Var}
    kept = [node for node in nodes
            if node.primitive.name != "broadcast_to" or node.outputs[0] in read]
    return rebuilt(graph, kept, {})
