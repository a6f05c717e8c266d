import numpy as np
from compiler_graphs import aval
from compiler_graphs import build
from compiler_graphs import lit
from compiler_graphs import prim_names
from compiler_graphs import run

from keras_ipu.device.compiler.fusion import fuse_elementwise
from keras_ipu.device.compiler.liveness import analyze_liveness
from keras_ipu.device.compiler.lowering import lower


def _kernel_source(node):
    avals_in = [v.aval for v in node.inputs]
    avals_out = [v.aval for v in node.outputs]
    return lower(node.primitive, node.params, avals_in, avals_out).source


def test_chain_becomes_one_node_reusing_buffers():
    def body(b, x, bias):
        y = b.op("add", x, bias)
        y = b.op("max", y, lit(0.0, "float32"))
        y = b.op("mul", y, lit(2.0, "float32"))
        return b.op("exp", y)

    g = build([aval((4, 3)), aval((3,))], body)
    fused = fuse_elementwise(g)
    assert prim_names(fused) == ["fused_elementwise"]
    node = fused.nodes[0]
    assert [s[0].name for s in node.params["chain"]] == ["add", "max", "mul", "exp"]
    src = _kernel_source(node)
    # Only the first step allocates; the others write into its buffer.
    assert src.count("out=t") == 3, src
    x = np.linspace(-2, 2, 12, dtype=np.float32).reshape(4, 3)
    bias = np.array([0.5, -0.5, 0.0], np.float32)
    expected = np.exp(2 * np.maximum(x + bias, 0))
    (out,) = run(fused, x, bias)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, expected, rtol=1e-6)
    # The inputs were not written into.
    np.testing.assert_array_equal(x, np.linspace(-2, 2, 12, dtype=np.float32).reshape(4, 3))


def test_values_read_outside_are_outputs_and_not_overwritten():
    def body(b, x):
        a = b.op("exp", x)
        c = b.op("neg", a)
        return [a, b.op("add", c, x)]

    g = build([aval((5,))], body)
    fused = fuse_elementwise(g)
    assert prim_names(fused) == ["fused_elementwise"]
    src = _kernel_source(fused.nodes[0])
    assert "out=t0" not in src  # t0 (exp) is an output: never a scratch buffer
    x = np.arange(5, dtype=np.float32)
    a, out = run(fused, x)
    np.testing.assert_allclose(a, np.exp(x), rtol=1e-6)
    np.testing.assert_allclose(out, -np.exp(x) + x, rtol=1e-6)


def test_different_shapes_and_non_elementwise_nodes_split_groups():
    def body(b, x):
        e = b.op("exp", x)  # (4, 3)
        s = b.op("reduce_sum", e, axes=(1,))  # not elementwise
        t = b.op("neg", s)  # (4,): another shape
        return b.op("log", t)

    g = build([aval((4, 3))], body)
    fused = fuse_elementwise(g)
    assert prim_names(fused) == ["exp", "reduce_sum", "fused_elementwise"]


def test_hoisting_keeps_program_order_valid():
    # e is read by reduce_max (outside), then m = mul(e, 2) joins e's group
    # by hoisting; h = sub(e, r) cannot (r comes after the group's anchor).
    def body(b, x):
        d = b.op("add", x, x)
        e = b.op("max", d, lit(0.0, "float32"))
        r = b.op("reduce_max", e, axes=(1,))
        r = b.op("reshape", r, new_shape=(2, 1))
        h = b.op("sub", e, r)
        m = b.op("mul", e, lit(2.0, "float32"))
        return [h, m]

    g = build([aval((2, 3))], body)
    fused = fuse_elementwise(g)
    names = prim_names(fused)
    assert names == ["fused_elementwise", "reduce_max", "reshape", "sub"]
    assert [s[0].name for s in fused.nodes[0].params["chain"]] == ["add", "max", "mul"]
    x = np.array([[1.0, -2.0, 3.0], [-1.0, 0.5, 2.0]], np.float32)
    h, m = run(fused, x)
    e = np.maximum(2 * x, 0)
    np.testing.assert_allclose(h, e - e.max(1, keepdims=True))
    np.testing.assert_allclose(m, 2 * e)


def test_sealed_group_does_not_move_past_its_reader():
    def body(b, x):
        e = b.op("exp", x)
        s = b.op("reduce_sum", e, axes=(0,))  # reads e: seals the group
        s = b.op("broadcast_to", s, shape=(3,))
        return b.op("add", e, s)  # needs s, made after the anchor

    g = build([aval((3,))], body)
    fused = fuse_elementwise(g)
    assert prim_names(fused) == ["exp", "reduce_sum", "broadcast_to", "add"]


def test_liveness_last_uses_and_peak_bytes():
    def body(b, x):
        a = b.op("exp", x)  # 0
        c = b.op("neg", a)  # 1: last use of a
        d = b.op("add", c, x)  # 2: last use of c and x
        return d

    g = build([aval((1000,))], body)
    live = analyze_liveness(g)
    x = g.inputs[0]
    a, c, d = (n.outputs[0] for n in g.nodes)
    assert live.last_use[x] == 2
    assert live.last_use[a] == 1
    assert live.last_use[c] == 2
    assert live.last_use[d] == 3  # a graph output lives to the end
    # x and a and c are live together at step 1 (x stays for step 2).
    assert live.peak_bytes == 3 * 4000
    assert live.peak_at == 1


def test_liveness_counts_constants_apart():
    big = lit(np.ones(256, np.float32))
    g = build([aval((256,))], lambda b, x: b.op("add", x, big))
    live = analyze_liveness(g)
    assert live.constant_bytes == 1024
    assert live.peak_bytes == 2 * 1024


def test_fused_node_is_differentiable_through_its_chain():
    from keras_ipu.device import autodiff
    from keras_ipu.device.interpreter import eval_graph

    def body(b, x, y):
        t = b.op("mul", x, y)
        t = b.op("tanh", t)
        return b.op("add", t, x)

    g = build([aval((3,)), aval((3,))], body)
    fused = fuse_elementwise(g)
    assert prim_names(fused) == ["fused_elementwise"]
    x = np.array([0.1, -0.5, 2.0], np.float32)
    y = np.array([1.5, 0.3, -0.2], np.float32)

    def loss(graph):
        return lambda x, y: autodiff_sum(eval_graph(graph, x, y)[0])

    def autodiff_sum(v):
        from keras_ipu.device.primitives import REGISTRY

        return REGISTRY["reduce_sum"].bind(v, axes=(0,))

    gx, gy = autodiff.grad(loss(fused), argnums=(0, 1))(x, y)
    sech2 = 1 - np.tanh(x * y) ** 2
    np.testing.assert_allclose(np.asarray(gx), sech2 * y + 1, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(gy), sech2 * x, rtol=1e-5)
