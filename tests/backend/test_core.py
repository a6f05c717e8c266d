"""Backend control flow (cond, switch, while_loop, fori_loop, scan, map,
vectorized_map, associative_scan), gradient control (stop_gradient,
custom_gradient, remat), numpy.vectorize and compute_output_spec.

Every function is checked eagerly against NumPy, then traced (with a None
dimension where it matters) and the recorded graph evaluated by the
interpreter, which must give the same values and contain the control-flow
primitive rather than an unrolled copy.
"""

import numpy as np
import pytest

from keras import ops
from keras.src import tree
from keras.src.backend.common.keras_tensor import KerasTensor

from keras_ipu.backend import control_flow as cfb
from keras_ipu.backend import core
from keras_ipu.backend.numpy import vectorize
from keras_ipu.device.array import Tensor
from keras_ipu.device.interpreter import eval_graph
from keras_ipu.device.ir import ShapedArray
from keras_ipu.device.trace import trace_flat

RNG = np.random.default_rng(0)


def traced(fn, *args, shapes=None):
    """Trace fn on avals of args (with `shapes` overriding), return the graph
    and its values for args."""
    shapes = shapes or [a.shape for a in args]
    avals = [ShapedArray(s, a.dtype) for s, a in zip(shapes, args)]
    box = {}

    def flat(*tracers):
        out = fn(*tracers)
        box["tree"] = out
        return [x for x in tree.flatten(out) if x is not None]

    graph, captures = trace_flat(flat, avals)
    assert not captures
    values = [np.asarray(v) for v in eval_graph(graph, *args)]
    leaves = [None if x is None else values.pop(0)
              for x in tree.flatten(box["tree"])]
    return graph, tree.pack_sequence_as(box["tree"], leaves)


def prims(graph):
    return [n.primitive.name for n in graph.nodes]


# -- cond / switch ------------------------------------------------------------


def test_cond_eager_runs_python_branch():
    assert cfb.cond(True, lambda: 0, lambda: 1) == 0
    assert cfb.cond(Tensor(np.array(False)), lambda: 0, lambda: 1) == 1
    assert cfb.cond(False, lambda: None, lambda: None) is None


@pytest.mark.parametrize("scale", [1.0, -1.0])
def test_cond_traced_with_closures_and_weak_scalars(scale):
    x = (np.arange(6, dtype="float32").reshape(3, 2) * scale).astype("float32")

    def fn(x):
        total = ops.sum(x)
        # Branches close over the traced x and total; one returns a Python
        # float, which takes the other branch's dtype.
        return cfb.cond(
            total > 0,
            lambda: (x * 2.0, total),
            lambda: (x - 1.0, 0.0),
        )

    graph, (a, b) = traced(fn, x, shapes=[(None, 2)])
    assert "cond" in prims(graph)
    if scale > 0:
        np.testing.assert_allclose(a, x * 2)
        np.testing.assert_allclose(b, x.sum())
    else:
        np.testing.assert_allclose(a, x - 1)
        assert b == 0.0
    assert b.dtype == np.float32
    assert graph.nodes[-1].outputs[0].aval.shape == (None, 2)


def test_cond_traced_rejects_branches_of_different_shapes():
    def fn(x):
        return cfb.cond(ops.sum(x) > 0, lambda: x, lambda: x[:1])

    with pytest.raises(ValueError, match="differs"):
        traced(fn, np.ones((3,), "float32"))


def test_switch_clips_index_eagerly_and_traced():
    x = RNG.random((2, 3)).astype("float32")
    y = RNG.random((2, 3)).astype("float32")
    branches = [lambda a, b: a + b, lambda a, b: a - b, lambda a, b: a * b]
    for index, expected in [(-3, x + y), (1, x - y), (9, x * y)]:
        np.testing.assert_allclose(cfb.switch(index, branches, x, y), expected)
        graph, out = traced(
            lambda i, a, b: cfb.switch(i, branches, a, b),
            np.array(index, "int32"), x, y,
        )
        assert "cond" in prims(graph)
        np.testing.assert_allclose(out, expected, rtol=1e-6)


# -- while_loop / fori_loop ---------------------------------------------------


@pytest.mark.parametrize("maximum_iterations,expected", [(None, 10), (4, 4)])
def test_while_loop_eager_and_traced(maximum_iterations, expected):
    def run(v):
        return cfb.while_loop(
            lambda i, s: i < 10,
            lambda i, s: (i + 1, s * 2.0),
            (0, v),
            maximum_iterations=maximum_iterations,
        )

    v = np.array([1.0, 3.0], "float32")
    i, s = run(v)
    assert int(i) == expected
    np.testing.assert_allclose(s, v * 2.0**expected)
    graph, (ti, ts) = traced(run, v, shapes=[(None,)])
    assert "while_loop" in prims(graph)
    assert int(ti) == expected
    np.testing.assert_allclose(ts, v * 2.0**expected)


def test_while_loop_single_value_keeps_structure():
    out = cfb.while_loop(lambda x: x < 5, lambda x: x + 2, 0)
    assert int(out) == 6
    graph, out = traced(
        lambda x: cfb.while_loop(lambda x: ops.sum(x) < 5, lambda x: x + 2, x),
        np.array([0], "int32"),
    )
    np.testing.assert_array_equal(out, [6])


def test_fori_loop_static_bounds_traced_is_a_scan():
    x = np.array([1.0, 2.0], "float32")
    body = lambda i, v: v * 2.0 + ops.cast(i, "float32")  # noqa: E731
    expected = x
    for i in range(2, 6):
        expected = expected * 2.0 + i
    np.testing.assert_allclose(cfb.fori_loop(2, 6, body, x), expected)
    graph, out = traced(lambda v: cfb.fori_loop(2, 6, body, v), x)
    assert prims(graph) == ["scan"]
    np.testing.assert_allclose(out, expected)


def test_fori_loop_traced_bounds_is_a_while_loop():
    x = np.array([1.0, 2.0], "float32")
    graph, out = traced(
        lambda n, v: cfb.fori_loop(0, n, lambda i, v: v + 1.0, v),
        np.array(3, "int32"), x,
    )
    assert "while_loop" in prims(graph)
    np.testing.assert_allclose(out, x + 3)


# -- scan / map / vectorized_map ----------------------------------------------


def _cumsum(carry, x):
    carry = carry + x
    return carry, carry


@pytest.mark.parametrize("reverse", [False, True])
def test_scan_matches_cumsum_eager_and_traced(reverse):
    xs = RNG.random((6, 3)).astype("float32")
    expected = np.cumsum(xs[::-1] if reverse else xs, axis=0)
    if reverse:
        expected = expected[::-1]
    carry, ys = cfb.scan(_cumsum, np.zeros(3, "float32"), xs, reverse=reverse)
    np.testing.assert_allclose(ys, expected, rtol=1e-6)
    np.testing.assert_allclose(carry, xs.sum(0), rtol=1e-6)
    graph, (tcarry, tys) = traced(
        lambda xs: cfb.scan(_cumsum, ops.zeros((3,)), xs, reverse=reverse),
        xs, shapes=[(None, 3)],
    )
    assert prims(graph) == ["scan"]
    assert graph.nodes[0].outputs[1].aval.shape == (None, 3)
    np.testing.assert_allclose(tys, expected, rtol=1e-6)
    np.testing.assert_allclose(tcarry, xs.sum(0), rtol=1e-6)


def test_scan_nested_structures_and_no_xs():
    def fib(carry, _):
        a, b = carry
        return (b, a + b), {"sum": a + b}

    init = (np.float32(0.0), np.float32(1.0))
    (a, b), ys = cfb.scan(fib, init, length=6)
    assert float(a) == 8 and float(b) == 13
    np.testing.assert_allclose(ys["sum"], [1, 2, 3, 5, 8, 13])
    graph, ((ta, tb), tys) = traced(
        lambda a, b: cfb.scan(fib, (a, b), length=6),
        np.array(0.0, "float32"), np.array(1.0, "float32"),
    )
    assert float(ta) == 8 and float(tb) == 13
    np.testing.assert_allclose(tys["sum"], [1, 2, 3, 5, 8, 13])


def test_scan_ys_none_and_argument_errors():
    carry, ys = cfb.scan(lambda c, x: (c + x, None), np.float32(0), np.ones(4, "float32"))
    assert ys is None and float(carry) == 4
    graph, (tcarry, tys) = traced(
        lambda xs: cfb.scan(lambda c, x: (c + x, None), np.float32(0), xs),
        np.ones(4, "float32"),
    )
    assert tys is None and float(tcarry) == 4
    with pytest.raises(TypeError, match="should be a callable"):
        cfb.scan(1, 0.0, np.ones(3))
    with pytest.raises(ValueError, match="positive integer or boolean"):
        cfb.scan(_cumsum, 0.0, np.ones(3), unroll=0)
    with pytest.raises(ValueError, match="to scan over and"):
        cfb.scan(_cumsum, 0.0)


def test_scan_carry_dtype_is_kept():
    # An int8 counter plus a Python int stays int8 inside the loop.
    graph, (c, _) = traced(
        lambda xs: cfb.scan(lambda c, x: (c + 1, x), ops.zeros((), "int8"), xs),
        np.ones((3,), "float32"),
    )
    assert c.dtype == np.int8 and int(c) == 3


def test_map_and_vectorized_map_nested():
    xs = {"a": RNG.random((4, 2)).astype("float32"), "b": np.arange(4, dtype="int32")}

    def f(x):
        return {"s": x["a"] * 2.0, "t": x["b"] + 1}

    out = cfb.map(f, xs)
    np.testing.assert_allclose(out["s"], xs["a"] * 2)
    np.testing.assert_array_equal(out["t"], xs["b"] + 1)
    graph, tout = traced(lambda a, b: cfb.vectorized_map(f, {"a": a, "b": b}),
                         xs["a"], xs["b"], shapes=[(None, 2), (None,)])
    assert prims(graph) == ["scan"]
    np.testing.assert_allclose(tout["s"], xs["a"] * 2)
    np.testing.assert_array_equal(tout["t"], xs["b"] + 1)
    pair = cfb.vectorized_map(lambda e: e[0] + e[1], [np.ones((2, 3)), np.ones((2, 3))])
    np.testing.assert_allclose(pair, 2 * np.ones((2, 3)))


# -- associative_scan ---------------------------------------------------------


@pytest.mark.parametrize("n", [1, 2, 5, 8, 13])
@pytest.mark.parametrize("reverse", [False, True])
def test_associative_scan_non_commutative_matches_sequential(n, reverse):
    # Composition of affine maps h -> a*h + b is associative, not commutative.
    a = RNG.random((n, 3)).astype("float32")
    b = RNG.random((n, 3)).astype("float32")

    def compose(earlier, later):
        return (later[0] * earlier[0], later[0] * earlier[1] + later[1])

    order = range(n - 1, -1, -1) if reverse else range(n)
    acc = None
    exp_a, exp_b = np.zeros_like(a), np.zeros_like(b)
    for t in order:
        acc = (a[t], b[t]) if acc is None else compose(acc, (a[t], b[t]))
        exp_a[t], exp_b[t] = acc
    got = cfb.associative_scan(compose, (a, b), reverse=reverse)
    np.testing.assert_allclose(got[0], exp_a, rtol=1e-5)
    np.testing.assert_allclose(got[1], exp_b, rtol=1e-5)
    # Unknown length while traced: a sequential scan gives the same values.
    graph, tgot = traced(
        lambda a, b: cfb.associative_scan(compose, (a, b), reverse=reverse),
        a, b, shapes=[(None, 3), (None, 3)],
    )
    assert "scan" in prims(graph)
    np.testing.assert_allclose(tgot[0], exp_a, rtol=1e-5)
    np.testing.assert_allclose(tgot[1], exp_b, rtol=1e-5)


def test_associative_scan_other_axis_and_length_check():
    x = RNG.random((3, 7)).astype("float32")
    np.testing.assert_allclose(
        cfb.associative_scan(lambda p, q: p + q, x, axis=1), np.cumsum(x, 1), rtol=1e-5
    )
    with pytest.raises(ValueError, match=" first dimension"):
        cfb.associative_scan(lambda p, q: p, (np.ones(2), np.ones(3)))


# -- gradient control ---------------------------------------------------------


def test_stop_gradient_is_identity_and_traced_as_a_node():
    x = np.array([1.0, -2.0], "float32")
    np.testing.assert_array_equal(core.stop_gradient(x), x)
    graph, out = traced(core.stop_gradient, x, shapes=[(None,)])
    assert prims(graph) == ["stop_gradient"]
    np.testing.assert_array_equal(out, x)


def _log1pexp():
    @core.custom_gradient
    def log1pexp(x):
        e = ops.exp(x)

        def grad(*args, upstream=None):
            if upstream is None:
                (upstream,) = args
            return ops.multiply(upstream, 1.0 - 1.0 / ops.add(1, e))

        return ops.log(1 + e), grad

    return log1pexp


def test_custom_gradient_eager_and_traced_backward_graph():
    f = _log1pexp()
    x = np.array([0.0, 1.0, 3.0], "float32")
    np.testing.assert_allclose(f(x), np.log1p(np.exp(x)), rtol=1e-6)
    graph, out = traced(f, x, shapes=[(None,)])
    assert prims(graph) == ["custom_vjp"]
    np.testing.assert_allclose(out, np.log1p(np.exp(x)), rtol=1e-6)
    node = graph.nodes[0]
    fwd_out = eval_graph(node.params["fwd"], x)
    assert len(fwd_out) == 2  # the output and the residual exp(x)
    upstream = np.array([1.0, 2.0, 0.5], "float32")
    (g,) = eval_graph(node.params["bwd"], upstream, *fwd_out[1:])
    np.testing.assert_allclose(
        np.asarray(g), upstream * (1 - 1 / (1 + np.exp(x))), rtol=1e-6
    )


def test_custom_gradient_with_variable_and_none_gradients():
    from keras_ipu.backend.core import Variable

    @core.custom_gradient
    def scaled(x, s):
        def grad(upstream):
            return upstream * s, None

        return x * s, grad

    v = Variable(np.float32(3.0), trainable=False)
    np.testing.assert_allclose(scaled(np.array([1.0, 2.0], "float32"), v), [3.0, 6.0])
    graph, out = traced(lambda x, s: scaled(x, s), np.ones(2, "float32"), np.float32(3.0))
    np.testing.assert_allclose(out, [3.0, 3.0])
    assert graph.nodes[-1].params["bwd_nonzero"] == (True, False)


def test_remat_eager_and_traced():
    f = core.remat(lambda a, b: ops.sin(a) * b)
    x = np.array([0.0, 0.5, 1.0], "float32")
    np.testing.assert_allclose(f(x, 2.0), np.sin(x) * 2, rtol=1e-6)
    graph, out = traced(lambda t: f(t, 2.0), x, shapes=[(None,)])
    assert prims(graph) == ["remat"]
    np.testing.assert_allclose(out, np.sin(x) * 2, rtol=1e-6)


# -- numpy.vectorize ----------------------------------------------------------


def test_vectorize_scalar_and_signature():
    add = vectorize(lambda a, b: a + b)
    np.testing.assert_array_equal(add(np.array([1, 2, 3]), 2), [3, 4, 5])
    x = RNG.random((2, 3, 4, 4)).astype("float32")
    total = vectorize(lambda m: ops.sum(m * m), signature="(d,d)->()")
    np.testing.assert_allclose(total(x), (x * x).sum((-2, -1)), rtol=1e-5)
    mv = vectorize(lambda m, v: ops.matmul(m, v), signature="(m,n),(n)->(m)")
    v = RNG.random((4,)).astype("float32")
    np.testing.assert_allclose(mv(x, v), x @ v, rtol=1e-5)
    graph, out = traced(lambda m: mv(m, v), x)
    assert "scan" in prims(graph)
    np.testing.assert_allclose(out, x @ v, rtol=1e-5)
    with pytest.raises(ValueError, match="signature"):
        vectorize(lambda m: m, signature="(d,d->()")


def test_vectorize_excluded_argument_is_passed_through():
    f = vectorize(lambda x, power: x**power, excluded={1})
    np.testing.assert_allclose(f(np.array([1.0, 2.0, 3.0]), 2), [1.0, 4.0, 9.0])


# -- compute_output_spec ------------------------------------------------------


def test_compute_output_spec_with_nested_control_flow_and_closures():
    def fn(x, y):
        def body(c, xt):
            # A cond inside a scan body, closing over y from the outer trace.
            c = cfb.cond(ops.sum(xt) > 0, lambda: c + xt * y, lambda: c)
            return c, c
        return cfb.scan(body, ops.zeros_like(x[0]), x)

    carry, ys = core.compute_output_spec(
        fn, KerasTensor((None, 4)), KerasTensor((4,))
    )
    assert carry.shape == (4,) and ys.shape == (None, 4)
    assert carry.dtype == "float32"


def test_compute_output_spec_keeps_unknown_dims_through_cond():
    out = core.compute_output_spec(
        lambda p, x: cfb.cond(p, lambda: x * 2, lambda: x),
        KerasTensor((), dtype="bool"), KerasTensor((None, 3)),
    )
    assert out.shape == (None, 3)


def test_output_specs_never_run_an_uninitialized_variables_initializer():
    # A model built in StatelessScope(initialize_variables=False) (the
    # memory prediction's BERT-large: 340M weights) is traced for shapes
    # only: its initializers must not draw every weight on the host, as
    # Keras' placeholder for an uninitialized variable would.
    import keras

    drawn = []

    class Counting(keras.initializers.GlorotUniform):
        def __call__(self, shape, dtype=None):
            drawn.append(tuple(shape))
            return super().__call__(shape, dtype)

    with keras.StatelessScope(initialize_variables=False):
        kernel = keras.Variable(Counting(), shape=(16, 32), dtype="float32")
        half = keras.Variable(Counting(), shape=(32,), dtype="float16")
        out, low = core.compute_output_spec(
            lambda x: (ops.matmul(x, kernel), ops.add(kernel[0], half)),
            KerasTensor((None, 16)))
        assert drawn == []
        assert out.shape == (None, 32) and out.dtype == "float32"
        assert low.shape == (32,) and low.dtype == "float32"
        # Read elsewhere, it is Keras' placeholder, its initializer's values.
        assert tuple(np.asarray(kernel.value).shape) == (16, 32)
        assert drawn == [(16, 32)]


def test_nested_loops_with_closures_match_eager():
    x = RNG.random((4, 3)).astype("float32")
    w = RNG.random((3,)).astype("float32")

    def fn(x, w):
        def row(carry, xt):
            # An inner loop that closes over w (outer trace) and xt (the
            # enclosing scan body), with a cond in its body.
            def inner(i, acc):
                return cfb.cond(
                    i % 2 == 0, lambda: acc + xt * w, lambda: acc - w
                )

            acc = cfb.fori_loop(0, 3, inner, carry)
            return acc, ops.sum(acc)

        return cfb.scan(row, ops.zeros((3,)), x)

    eager_carry, eager_ys = fn(x, w)
    graph, (carry, ys) = traced(fn, x, w, shapes=[(None, 3), (3,)])
    assert prims(graph) == ["scan"]
    np.testing.assert_allclose(carry, eager_carry, rtol=1e-5)
    np.testing.assert_allclose(ys, eager_ys, rtol=1e-5)
    acc = np.zeros(3, "float32")
    expected = []
    for t in range(4):
        for i in range(3):
            acc = acc + x[t] * w if i % 2 == 0 else acc - w
        expected.append(acc.sum())
    np.testing.assert_allclose(ys, expected, rtol=1e-5)


def test_compute_output_spec_with_arithmetic_on_an_unknown_dimension():
    import keras
    from keras import ops

    def fn(x):
        n = ops.shape(x)[0] * ops.shape(x)[1]  # None * 8 without stand-ins
        return ops.reshape(x, (n,)), ops.sum(x, axis=1), ops.zeros((3,))

    flat, summed, fixed = core.compute_output_spec(fn, keras.KerasTensor((None, 8)))
    assert flat.shape == (None,)
    assert summed.shape == (None,)
    assert fixed.shape == (3,)


def test_compute_output_spec_error_without_unknown_dimensions_is_the_original():
    import keras

    def fn(x):
        raise TypeError("bad layer")

    with pytest.raises(TypeError, match="bad layer"):
        core.compute_output_spec(fn, keras.KerasTensor((2, 8)))
    with pytest.raises(TypeError, match="bad layer"):
        core.compute_output_spec(fn, keras.KerasTensor((None, 8)))


def test_traced_nodes_name_the_keras_layer_forward_and_backward():
    import collections

    import keras

    from keras_ipu.device.autodiff import grad
    from keras_ipu.device.ir import ShapedArray
    from keras_ipu.device.trace import trace_flat

    model = keras.Sequential(
        [keras.Input((4,)), keras.layers.Dense(3, activation="relu", name="d1"),
         keras.layers.Dense(2, name="d2")],
        name="net",
    )
    weights = [v.value for v in model.trainable_variables]

    def loss(ws, x):
        y, _ = model.stateless_call(ws, [], x)
        return ops.sum(y)

    def gradients(x, *ws):
        return list(grad(loss)(list(ws), x))

    avals = [ShapedArray((8, 4), np.dtype("float32"))] + [
        ShapedArray(w.shape, np.dtype("float32")) for w in weights
    ]
    graph, _ = trace_flat(gradients, avals)
    sources = collections.Counter(n.source for n in graph.nodes)
    assert set(sources) == {"net/d1", "net/d2", None}
    # Every matmul, forward or backward, is attributed to its layer; d2's
    # are its forward, its kernel's gradient and the gradient it passes on.
    dot_sources = [n.source for n in graph.nodes if n.primitive.name == "dot_general"]
    assert None not in dot_sources
    assert dot_sources.count("net/d2") == 3 and dot_sources.count("net/d1") >= 2
