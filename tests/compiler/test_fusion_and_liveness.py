import numpy as np
import pytest
from compiler_graphs import aval
from compiler_graphs import build
from compiler_graphs import lit
from compiler_graphs import prim_names
from compiler_graphs import run

from keras_ipu.device.compiler.fusion import fuse_elementwise
from keras_ipu.device import liveness
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
    # The add reads the sum through its broadcast (broadcast_operands.py).
    assert prim_names(fused) == ["exp", "reduce_sum", "add"]


def test_liveness_last_uses_and_peak_bytes():
    def body(b, x):
        a = b.op("exp", x)  # 0
        c = b.op("neg", a)  # 1: last use of a
        d = b.op("add", c, x)  # 2: last use of c and x
        return d

    g = build([aval((1000,))], body)
    live = liveness.analyze(g)
    x = g.inputs[0]
    a, c, d = (n.outputs[0] for n in g.nodes)
    assert live.last_use[x] == 2
    assert live.last_use[a] == 1
    assert live.last_use[c] == 2
    assert live.last_use[d] == 3  # a graph output lives to the end
    assert live.readers[x] == [0, 2] and live.dying_after(2) == [x, c]
    # x and a and c are live together at step 1 (x stays for step 2).
    host = liveness.peak(g, lambda v: (v.aval.nbytes,), inputs_live=True)
    assert host.maxima == [3 * 4000]
    assert host.step.index == 1
    # The IPU's view: inputs always live elsewhere, so a alone, then a and c.
    device = liveness.peak(g, lambda v: (v.aval.nbytes,))
    assert device.maxima == [2 * 4000] and device.step.index == 1


def test_liveness_counts_constants_apart():
    big = lit(np.ones(256, np.float32))
    g = build([aval((256,))], lambda b, x: b.op("add", x, big))
    assert liveness.analyze(g).constant_bytes == 1024
    assert liveness.peak(g, lambda v: (v.aval.nbytes,), inputs_live=True).maxima == [2 * 1024]


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


# -- speed work of issue 3 item 5: merging, donation, folds, scan pruning ----

from keras_ipu.device.compiler.dead_code import eliminate_dead_code  # noqa: E402
from keras_ipu.device.compiler.options import CompileOptions  # noqa: E402
from keras_ipu.device.compiler.pipeline import build_executable  # noqa: E402

_MATMUL = (((1,), (0,)), ((), ()))
_rng = np.random.default_rng(5)


def rng_array(shape):
    return _rng.standard_normal(shape).astype(np.float32)


def _executable(graph):
    # Lowered as it is (its bodies compiled with the default passes).
    return build_executable(graph, CompileOptions(fp_behaviour=None))


@pytest.mark.numpy_engine
def test_chain_fed_by_two_chains_is_one_node():
    # The SGD-with-momentum update: m' = m * 0.9 - g * lr; w' = w + m'.
    def body(b, m, g, lr, w):
        scaled = b.op("mul", g, lr)
        mom = b.op("mul", m, lit(0.9, "float32"))
        new_m = b.op("sub", mom, scaled)
        return [new_m, b.op("add", w, new_m)]

    g = build([aval((4, 3)), aval((4, 3)), aval(()), aval((4, 3))], body)
    fused = fuse_elementwise(g)
    assert prim_names(fused) == ["fused_elementwise"]
    m, grad, w = (rng_array((4, 3)) for _ in range(3))
    lr = np.asarray(0.01, np.float32)
    new_m, new_w = _executable(fused).run(m, grad, lr, w)
    want_m = m * np.float32(0.9) - grad * lr
    np.testing.assert_array_equal(new_m, want_m)
    np.testing.assert_array_equal(new_w, w + want_m)


def test_private_fresh_operand_is_donated_and_written_in_place():
    def body(b, x, w, bias):
        d = b.op("dot_general", x, w, dimension_numbers=_MATMUL)
        y = b.op("add", d, bias)
        return b.op("max", y, lit(0.0, "float32"))

    g = build([aval((5, 4)), aval((4, 3)), aval((3,))], body)
    fused = fuse_elementwise(g)
    node = fused.nodes[1]
    assert node.params["donate"] == (0,)
    assert "out=x0" in _kernel_source(node)
    x, w, bias = rng_array((5, 4)), rng_array((4, 3)), rng_array((3,))
    copies = [x.copy(), w.copy(), bias.copy()]
    (out,) = _executable(fused).run(x, w, bias)
    np.testing.assert_allclose(out, np.maximum(x @ w + bias, 0), rtol=1e-6)
    for a, c in zip((x, w, bias), copies):  # inputs are never donated
        np.testing.assert_array_equal(a, c)


def test_value_read_elsewhere_or_returned_is_not_donated():
    def body(b, x, w):
        d = b.op("dot_general", x, w, dimension_numbers=_MATMUL)
        e = b.op("exp", b.op("neg", d))
        view = b.op("reshape", d, new_shape=(15,))  # a view of d's buffer
        return [e, view]

    g = build([aval((5, 4)), aval((4, 3))], body)
    fused = fuse_elementwise(g)
    chain = [n for n in fused.nodes if n.primitive.name == "fused_elementwise"]
    assert chain and "donate" not in chain[0].params
    x, w = rng_array((5, 4)), rng_array((4, 3))
    e, view = _executable(fused).run(x, w)
    np.testing.assert_allclose(view, (x @ w).reshape(15), rtol=1e-6)
    np.testing.assert_allclose(e, np.exp(-(x @ w)), rtol=1e-6)


def test_transpose_of_a_product_becomes_the_swapped_product():
    # The weight gradient of x @ w: x^T g, then transposed back.
    def body(b, x, grad):
        d = b.op("dot_general", x, grad, dimension_numbers=(((0,), (0,)), ((), ())))
        return b.op("transpose", d, permutation=(1, 0))

    g = build([aval((6, 4)), aval((6, 3))], body)
    fused = fuse_elementwise(g)
    assert prim_names(fused) == ["dot_general"]
    x, grad = rng_array((6, 4)), rng_array((6, 3))
    (out,) = _executable(fused).run(x, grad)
    assert out.shape == (3, 4) and out.flags.c_contiguous
    np.testing.assert_allclose(out, (x.T @ grad).T, rtol=1e-5)


def test_transpose_kept_when_the_product_is_read_too():
    def body(b, x, grad):
        d = b.op("dot_general", x, grad, dimension_numbers=(((0,), (0,)), ((), ())))
        return [d, b.op("transpose", d, permutation=(1, 0))]

    g = build([aval((6, 4)), aval((6, 3))], body)
    assert prim_names(fuse_elementwise(g)) == ["dot_general", "transpose"]


def _pad_sum(b, pieces, widths, total):
    acc = None
    lo = 0
    for piece, width in zip(pieces, widths):
        padded = b.op("pad", piece, lit(0.0, "float32"),
                      config=((0, 0, 0), (lo, total - lo - width, 0)))
        acc = padded if acc is None else b.op("add", acc, padded)
        lo += width
    return acc


def test_sum_of_padded_pieces_becomes_a_concatenate():
    # The gradient of slicing a [2, 7] array into widths 3, 1, 3.
    def body(b, p0, p1, p2):
        return b.op("mul", _pad_sum(b, [p0, p1, p2], [3, 1, 3], 7), lit(2.0, "float32"))

    g = build([aval((2, 3)), aval((2, 1)), aval((2, 3))], body)
    fused = fuse_elementwise(g)
    assert prim_names(fused) == ["concatenate", "mul"]
    pieces = [rng_array((2, 3)), rng_array((2, 1)), rng_array((2, 3))]
    (out,) = _executable(fused).run(*pieces)
    np.testing.assert_array_equal(out, 2 * np.concatenate(pieces, axis=1))


def test_padded_pieces_that_leave_a_gap_stay_a_sum():
    def body(b, p0, p1):
        return _pad_sum(b, [p0, p1], [3, 3], 7)  # column 6 is only padding

    g = build([aval((2, 3)), aval((2, 3))], body)
    fused = fuse_elementwise(g)
    assert "concatenate" not in prim_names(fused)
    p0, p1 = rng_array((2, 3)), rng_array((2, 3))
    (out,) = _executable(fused).run(p0, p1)
    np.testing.assert_array_equal(out, np.pad(np.concatenate([p0, p1], 1), ((0, 0), (0, 1))))


def _interleaved_sum(b, pieces, offsets, shape, strides):
    acc = None
    for piece, offset in zip(pieces, offsets):
        config = []
        for size, full, st, lo in zip(piece.aval.shape, shape, strides, offset):
            hi = full - lo - (size - 1) * st - 1
            config.append((lo, hi, st - 1))
        padded = b.op("pad", piece, lit(0.0, "float32"), config=tuple(config))
        acc = padded if acc is None else b.op("add", acc, padded)
    return acc


def _interleave_reference(pieces, offsets, shape, strides):
    out = np.zeros(shape, np.float32)
    for piece, offset in zip(pieces, offsets):
        out[tuple(slice(lo, None, st) for lo, st in zip(offset, strides))] += piece
    return out


@pytest.mark.parametrize("order", [(0, 1, 2, 3), (3, 1, 0, 2)])
def test_max_pool_gradient_pads_become_an_interleave(order):
    # A 2x2, stride-2 max pool's gradient (N, H, W, C): one pad per window
    # position with interior padding 1, added in any order.
    offsets = [(0, a, b, 0) for a in (0, 1) for b in (0, 1)]
    offsets = [offsets[k] for k in order]
    shape, strides = (2, 6, 4, 3), (1, 2, 2, 1)

    def body(b, *ps):
        return b.op("mul", _interleaved_sum(b, ps, offsets, shape, strides), lit(2.0, "float32"))

    g = build([aval((2, 3, 2, 3))] * 4, body)
    fused = fuse_elementwise(g)
    names = prim_names(fused)
    assert "pad" not in names and names.count("concatenate") == 3, names
    pieces = [rng_array((2, 3, 2, 3)) for _ in range(4)]
    (out,) = _executable(fused).run(*pieces)
    want = 2 * _interleave_reference(pieces, offsets, shape, strides)
    np.testing.assert_array_equal(out, want)


def test_interleaved_pads_that_miss_an_element_or_overlap_stay_a_sum():
    shape, strides = (4, 4), (2, 2)
    for offsets in ([(0, 0), (0, 1), (1, 0)], [(0, 0), (0, 1), (1, 0), (1, 0)]):
        def body(b, *ps, offsets=offsets):
            return _interleaved_sum(b, ps, offsets, shape, strides)

        g = build([aval((2, 2))] * len(offsets), body)
        fused = fuse_elementwise(g)
        assert "concatenate" not in prim_names(fused)
        pieces = [rng_array((2, 2)) for _ in offsets]
        (out,) = _executable(fused).run(*pieces)
        np.testing.assert_allclose(out, _interleave_reference(pieces, offsets, shape, strides))


def test_scan_drops_stacked_outputs_and_operands_nobody_reads():
    from keras_ipu.device.ir import ShapedArray
    from keras_ipu.device.primitives.control_flow import scan_p

    def step(b, c, x, unused_const):
        new_c = b.op("add", c, x)
        return [new_c, b.op("exp", x), b.op("mul", x, unused_const)]

    body = build([aval((3,)), aval((3,)), aval((3,))], step)

    def outer(b, c0, xs, k):
        carry, ys_exp, ys_mul = b.op(
            "scan", c0, xs, k, body=body, length=4, reverse=False,
            n_carry=1, n_xs=1, unroll=1)
        return [carry, ys_exp]  # ys_mul (and with it k) is dead

    g = build([aval((3,)), aval((4, 3)), aval((3,))], outer)
    pruned = eliminate_dead_code(g)
    (node,) = pruned.nodes
    assert len(node.outputs) == 2 and len(node.inputs) == 2
    assert node.params["n_xs"] == 1
    assert len(node.params["body"].inputs) == 2
    assert [v.aval for v in node.outputs] == [ShapedArray((3,), "float32"),
                                             ShapedArray((4, 3), "float32")]
    assert scan_p is node.primitive
    c0, xs = rng_array((3,)), rng_array((4, 3))
    carry, ys = _executable(pruned).run(c0, xs, rng_array((3,)))
    np.testing.assert_allclose(carry, c0 + xs.sum(0), rtol=1e-6)
    np.testing.assert_allclose(ys, np.exp(xs), rtol=1e-6)


# -- broadcasts read through (broadcast_operands.py) --------------------------


def _broadcast_product(b, col, x, y):
    # Cross-entropy's gradient: a per-row column broadcast to the logits.
    wide = b.op("broadcast_to", col, shape=(8, 10))
    return b.op("add", b.op("mul", wide, x), y)


@pytest.mark.numpy_engine
def test_a_broadcast_read_by_a_chain_is_read_through():
    g = build([aval((8, 1)), aval((8, 10)), aval((8, 10))], _broadcast_product)
    fused = fuse_elementwise(g)
    assert prim_names(fused) == ["fused_elementwise"]
    (chain,) = fused.nodes
    assert [tuple(v.aval.shape) for v in chain.inputs] == [(8, 1), (8, 10), (8, 10)]
    col, x, y = rng_array((8, 1)), rng_array((8, 10)), rng_array((8, 10))
    (out,) = _executable(fused).run(col, x, y)
    np.testing.assert_array_equal(out, np.broadcast_to(col, (8, 10)) * x + y)


@pytest.mark.numpy_engine
def test_a_broadcast_stays_where_a_step_needs_its_shape():
    def body(b, col, row):
        wide = b.op("broadcast_to", col, shape=(8, 10))
        # exp's only operand: the broadcast makes its shape. The add's two
        # operands broadcast to it by themselves (an outer sum).
        return [b.op("exp", wide), b.op("add", wide, row)]

    g = build([aval((8, 1)), aval((10,))], body)
    fused = fuse_elementwise(g)
    assert "broadcast_to" in prim_names(fused)
    exp = next(n for n in fused.nodes if n.primitive.name == "exp")
    add = next(n for n in fused.nodes if n.primitive.name == "add")
    assert tuple(exp.inputs[0].aval.shape) == (8, 10)
    assert [tuple(v.aval.shape) for v in add.inputs] == [(8, 1), (10,)]
    col, row = rng_array((8, 1)), rng_array((10,))
    e, a = _executable(fused).run(col, row)
    np.testing.assert_array_equal(e, np.exp(np.broadcast_to(col, (8, 10))))
    np.testing.assert_array_equal(a, np.broadcast_to(col, (8, 10)) + row)


def test_a_broadcast_read_elsewhere_too_is_kept():
    def body(b, col, x):
        wide = b.op("broadcast_to", col, shape=(8, 10))
        return [b.op("mul", wide, x), b.op("transpose", wide, permutation=(1, 0))]

    g = build([aval((8, 1)), aval((8, 10))], body)
    fused = fuse_elementwise(g)
    assert prim_names(fused).count("broadcast_to") == 1
    mul = next(n for n in fused.nodes if n.primitive.name == "mul")
    assert tuple(mul.inputs[0].aval.shape) == (8, 1)


# -- integers through a float and back (fusion._integral_float_to_int) --------


@pytest.mark.parametrize("source,middle,target", [
    ("int32", "float32", "int32"), ("int32", "float64", "int32"),
    ("int64", "float32", "int32"), ("uint8", "float32", "int8"),
    ("int32", "float32", "uint16"), ("int16", "float32", "int32"),
])
def test_integers_through_a_float_convert_back_as_the_convert_kernel_does(
        source, middle, target):
    from keras_ipu.device.compiler.fusion import build_fused_kernel
    from keras_ipu.device.primitives.convert import convert_element_type_p as convert

    info = np.iinfo(source)
    values = np.array([info.min, info.min + 1, info.max, info.max - 1, 0, 1, -1 if info.min else 2,
                       2 ** 24 + 1 if info.max > 2 ** 25 else info.max // 3,
                       -(2 ** 24 + 1) if info.min < -2 ** 25 else info.min // 3,
                       2 ** 31 - 65 if info.max > 2 ** 32 else 7], dtype=source)
    chain = (
        (convert, (("dtype", np.dtype(middle)),), (("in", 0, aval(values.shape, source)),),
         aval(values.shape, middle)),
        (convert, (("dtype", np.dtype(target)),), (("t", 0, aval(values.shape, middle)),),
         aval(values.shape, target)),
    )
    kernel = build_fused_kernel(chain, (1,), 1)
    assert "_integral_float_to_int" in kernel.__globals__["_k1"].__qualname__
    (got,) = kernel(values)
    want = convert.kernel(convert.kernel(values, dtype=np.dtype(middle)), dtype=np.dtype(target))
    assert got.dtype == np.dtype(target)
    np.testing.assert_array_equal(got, want)
