"""What Poplar holds of a fused chain (simulator/materialized.py), checked
by hand on a LAMB-like weight update of one vector of N elements (ipu2):
the square of the update direction read only by a sum, and the float32
conversion of the float16 weight read by one elementwise step, are not
held (Graphcore's reduction_square_add fusion and expression outliner)."""

import numpy as np

from keras_ipu.device.compiler.fusion import fuse_elementwise
from keras_ipu.device.simulator import memory_model
from keras_ipu.device.simulator.materialized import as_held
from keras_ipu.device.simulator.targets import TARGETS

from compiler_graphs import aval
from compiler_graphs import build
from compiler_graphs import lit

N = 1472 * 256
F32, F16 = np.dtype("float32"), np.dtype("float16")


def _lamb_like_update():
    """g (float16 gradient), m, v (float32 moments), w (float16 weight) ->
    new w, m, v: m and v updated, u = m / (sqrt(v) + eps), the weight
    decayed, its norm and u's as sums of squares, w - ratio * u in float32
    back to float16."""
    def body(b, g, m, v, w):
        m1 = b.op("add", m, b.op("mul", b.op("sub", b.op("convert_element_type", g, dtype=F32),
                                               m), lit(0.1, "float32")))
        v1 = b.op("add", v, b.op("mul", b.op("sub", b.op("convert_element_type",
                                                         b.op("square", g), dtype=F32), v),
                                      lit(0.001, "float32")))
        u = b.op("div", m1, b.op("add", b.op("sqrt", v1), lit(1e-6, "float32")))
        u_norm = b.op("reduce_sum", b.op("pow", u, lit(2.0, "float32")), axes=(0,))
        decayed = b.op("sub", w, b.op("mul", w, lit(0.01, "float16")))
        w_norm = b.op("reduce_sum", b.op("pow", decayed, lit(2.0, "float16")), axes=(0,))
        ratio = b.op("div", b.op("convert_element_type", w_norm, dtype=F32), u_norm)
        new_w = b.op("sub", b.op("convert_element_type", decayed, dtype=F32),
                     b.op("mul", ratio, u))
        return [b.op("convert_element_type", new_w, dtype=F16), m1, v1]

    graph = build([aval((N,), "float16"), aval((N,)), aval((N,)), aval((N,), "float16")], body)
    return fuse_elementwise(graph)


def _results(graph):
    return [[v.aval.short() for v in n.outputs] for n in graph.nodes]


def test_poplar_holds_neither_a_summed_square_nor_a_conversion_read_once():
    fused = _lamb_like_update()
    vec32, vec16 = f"f32[{N}]", f"f16[{N}]"
    # Our fusion returns 4 vectors from the moments' chain (m1, v1, u, u**2)
    # and, from the decay's, the decayed weight's square and its float32
    # conversion.
    assert _results(fused) == [[vec32] * 4, ["f32[]"], [vec16, vec32], ["f16[]"], ["f32[]"],
                               [vec16]]
    held = as_held(fused)
    # u**2 and the decayed weight's square are summed by reduce-square-add
    # reading u and the decayed weight; the conversion is part of the last
    # step's expression, which reads the float16 decayed weight.
    assert _results(held) == [[vec32] * 3, ["f32[]"], [vec16], ["f16[]"], ["f32[]"], [vec16]]
    u, decayed = held.nodes[0].outputs[2], held.nodes[2].outputs[0]
    assert held.nodes[1].inputs == [u] and held.nodes[3].inputs == [decayed]
    assert decayed in held.nodes[5].inputs
    assert as_held(held) is held and as_held(fused) is held
    # By hand: m1, v1 and the decayed weight take over the memory of m, v
    # and w (inputs, whose last reader made them), the new weight that of
    # the decayed one, the ratio that of u's norm; so the not-always-live
    # peak is u (4 N bytes) and the two norms (4 + 2 bytes) at steps 3-4.
    # Without the view it would be 10 N: at step 2, u beside the float32
    # conversion (4 N) and the square (2 N) of the decayed weight.
    report = memory_model.analyze_memory(fused, TARGETS["ipu2"])
    assert report.not_always_live_bytes == 4 * N + 4 + 2
