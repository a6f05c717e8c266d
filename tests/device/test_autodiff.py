"""Reverse-mode autodiff (keras_ipu.device.autodiff): the vjp/grad API,
gradients through control flow (cond, scan, fori_loop, custom_gradient,
stop_gradient, remat), a small Keras MLP loss, and the backward pass traced
into a graph. References are central finite differences in float64 or
hand-computed derivatives."""

import numpy as np
import pytest

import keras
from keras import ops

from keras_ipu.backend import control_flow as bcf
from keras_ipu.device import autodiff
from keras_ipu.device.interpreter import eval_graph
from keras_ipu.device.ir import ShapedArray
from keras_ipu.device.primitives import convert as cv
from keras_ipu.device.primitives import dot
from keras_ipu.device.primitives import elementwise as ew
from keras_ipu.device.primitives import reduce
from keras_ipu.device.primitives.registry import Primitive
from keras_ipu.device.trace import Tracer
from keras_ipu.device.trace import trace_flat

F64 = np.dtype("float64")


def host(x):
    return np.asarray(x)


# Keras' dtype rules demote float64 results of binary ops to float32 (as on
# JAX); the exact float64 checks build their functions from primitives.
def add(a, b):
    return ew.add_p.bind(*_same(a, b))


def mul(a, b):
    return ew.mul_p.bind(*_same(a, b))


def sub(a, b):
    return ew.sub_p.bind(*_same(a, b))


def _same(a, b):
    dt = np.result_type(host_dtype(a), host_dtype(b))
    return [x if host_dtype(x) == dt else (
        convert(x, dt) if hasattr(x, "aval") else np.asarray(x, dt))
        for x in (a, b)]


def host_dtype(x):
    return x.dtype if hasattr(x, "dtype") else np.asarray(x).dtype


def convert(a, dtype):
    return cv.convert_element_type_p.bind(a, dtype=np.dtype(dtype))


def sin(a):
    return ew.sin_p.bind(a)


def exp(a):
    return ew.exp_p.bind(a)


def tanh(a):
    return ew.tanh_p.bind(a)


def total(a):
    return reduce.reduce_sum_p.bind(a, axes=tuple(range(a.ndim)))


def gt0(a):
    return ew.gt_p.bind(total(a), np.float64(0.0))


def numeric_grad(f, x, eps=1e-6):
    """d f / d x for a float-scalar f of one float64 array."""
    x = np.asarray(x, F64)
    g = np.zeros_like(x)
    flat = g.reshape(-1)
    for j in range(x.size):
        hi = x.copy().reshape(-1)
        lo = x.copy().reshape(-1)
        hi[j] += eps
        lo[j] -= eps
        flat[j] = (float(host(f(hi.reshape(x.shape))))
                   - float(host(f(lo.reshape(x.shape))))) / (2 * eps)
    return g


def compiled(f, x):
    """f traced once into a graph, evaluated per call: the finite
    differences then see the same traced loops the gradient sees (an eager
    scan runs as a Python loop through the backend's stack)."""
    graph, captures = trace_flat(lambda a: [f(a)],
                                 [ShapedArray(np.shape(x), F64)])
    assert captures == []
    return lambda v: eval_graph(graph, v)[0]


def check(f, x, rtol=1e-5, atol=1e-7):
    g = autodiff.grad(f)(x)
    np.testing.assert_allclose(host(g), numeric_grad(compiled(f, x), x),
                               rtol=rtol, atol=atol)
    return g


def rand(*shape, seed=0):
    return np.random.default_rng(seed).uniform(-1, 1, shape).astype(F64)


# -- API --------------------------------------------------------------------


def test_vjp_returns_outputs_and_a_pullback_over_pytrees():
    x = rand(3)
    y = rand(3, seed=1)

    def f(inputs):
        a, b = inputs["a"], inputs["b"]
        return {"prod": mul(a, b), "sum": total(a)}

    out, back = autodiff.vjp(f, {"a": x, "b": y})
    np.testing.assert_allclose(host(out["prod"]), x * y)
    (grads,) = back({"prod": np.ones(3), "sum": np.float64(2.0)})
    np.testing.assert_allclose(host(grads["a"]), y + 2.0)
    np.testing.assert_allclose(host(grads["b"]), x)
    # A None cotangent is zero.
    (grads,) = back({"prod": None, "sum": np.float64(1.0)})
    np.testing.assert_allclose(host(grads["b"]), 0.0)
    # None in the outputs is no value; a None cotangent zeroes a subtree.
    out, back = autodiff.vjp(lambda a: (None, [sin(a), mul(a, a)]), x)
    assert out[0] is None
    (g,) = back((None, None))
    np.testing.assert_array_equal(host(g), 0.0)
    (g,) = back((None, [None, np.ones(3)]))
    np.testing.assert_allclose(host(g), 2 * x)


def test_grad_argnums_has_aux_and_value_and_grad():
    x, y = rand(4), rand(4, seed=2)

    def f(a, b, scale):
        loss = mul(total(mul(mul(a, b), mul(a, b))), np.float64(scale))
        return loss, {"norm": total(a)}

    (gx, gy), aux = autodiff.grad(f, argnums=(0, 1), has_aux=True)(x, y, 3.0)
    np.testing.assert_allclose(host(gx), 6 * x * y * y)
    np.testing.assert_allclose(host(gy), 6 * x * x * y)
    np.testing.assert_allclose(host(aux["norm"]), x.sum())
    value, g = autodiff.value_and_grad(
        lambda a: total(exp(a)))(x)
    np.testing.assert_allclose(host(value), np.exp(x).sum())
    np.testing.assert_allclose(host(g), np.exp(x))


def test_grad_of_a_non_scalar_function_is_an_error():
    with pytest.raises(TypeError, match="float scalar"):
        autodiff.grad(lambda a: a * 2)(rand(3))


def test_integer_inputs_and_unused_inputs_get_zero_gradients():
    x = rand(3)
    n = np.arange(3, dtype=np.int32)
    gx, gn, gz = autodiff.grad(
        lambda a, i, z: total(mul(a, convert(i, "float64"))), argnums=(0, 1, 2)
    )(x, n, rand(2))
    np.testing.assert_allclose(host(gx), [0.0, 1.0, 2.0])
    assert host(gn).dtype == np.int32 and not host(gn).any()
    np.testing.assert_array_equal(host(gz), 0.0)


def test_a_value_used_twice_accumulates():
    x = rand(5)
    check(lambda a: total(add(mul(sin(a), a), mul(a, a))), x)


def test_missing_rule_names_the_primitive():
    bare = Primitive("test_only_no_grad", lambda x: x, lambda x: x)
    try:
        with pytest.raises(NotImplementedError, match="test_only_no_grad"):
            autodiff.grad(lambda a: total(bare.bind(a)))(rand(3))
    finally:
        from keras_ipu.device.primitives.registry import REGISTRY

        del REGISTRY["test_only_no_grad"]


def test_a_rule_returning_the_wrong_shape_is_caught():
    from keras_ipu.device.primitives.registry import REGISTRY

    bad = Primitive("test_only_bad_grad", lambda x: x, lambda x: x)
    # Forgets to sum a cotangent back: returns a (2, 3) one for a (3,) value.
    bad.grad = lambda cts, inputs, outputs: [
        ew.add_p.bind(cts[0], np.zeros((2, 3)))]
    try:
        with pytest.raises(ValueError, match="test_only_bad_grad.*shape"):
            autodiff.grad(lambda a: total(bad.bind(a)))(rand(3))
    finally:
        del REGISTRY["test_only_bad_grad"]
    _, back = autodiff.vjp(sin, rand(3))
    with pytest.raises(ValueError, match="vjp_fn"):
        back(np.ones(4))


def test_nondiff_primitive_passes_no_gradient():
    x = rand(4)
    g = autodiff.grad(
        lambda a: total(mul(ops.stop_gradient(mul(a, a)), a)))(x)
    np.testing.assert_allclose(host(g), x * x)


# -- control flow -----------------------------------------------------------


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_cond_differentiates_the_taken_branch(sign):
    x = rand(3) + 2 * sign
    w = np.float64(1.5)

    def f(a):
        # The false branch closes over w (a capture).
        return total(bcf.cond(gt0(a),
                              lambda: mul(sin(a), a),
                              lambda: mul(exp(a), w)))

    g = check(f, x)
    want = (np.cos(x) * x + np.sin(x)) if sign > 0 else np.exp(x) * w
    np.testing.assert_allclose(host(g), want)


def test_cond_backward_reads_stored_values_instead_of_recomputing():
    def step(a):
        def loss(v):
            return total(bcf.cond(gt0(v), lambda: mul(sin(v), v),
                                  lambda: exp(v)))

        return [autodiff.grad(loss)(a)]

    graph, _ = trace_flat(step, [ShapedArray((3,), F64)])
    conds = [n for n in graph.nodes if n.primitive.name == "cond"]
    assert len(conds) == 2
    forward, backward = conds
    # The forward stores sin(v), sin(v)*v and exp(v) (each branch's slots).
    assert len(forward.outputs) == 1 + 3
    taken = [n.primitive.name for n in backward.params["branches"][1].nodes]
    assert "cos" in taken and "sin" not in taken
    other = [n.primitive.name for n in backward.params["branches"][0].nodes]
    assert "exp" not in other
    for x in (rand(3) + 1.0, rand(3) - 1.0):
        (g,) = eval_graph(graph, x)
        want = np.cos(x) * x + np.sin(x) if x.sum() > 0 else np.exp(x)
        np.testing.assert_allclose(host(g), want)
    # prim.grad (no stored values) recomputes and agrees.
    x = rand(3) + 1.0
    inner, _ = trace_flat(
        lambda v: [bcf.cond(gt0(v), lambda: mul(sin(v), v),
                            lambda: exp(v))], [ShapedArray((3,), F64)])
    (node,) = [n for n in inner.nodes if n.primitive.name == "cond"]
    index = ew.gt_p.bind(np.float64(x.sum()), np.float64(0.0))
    index = convert(index, "int32")
    outs = node.primitive.bind(index, x, **node.params)
    plain = node.primitive.grad([np.ones(3)], [index, x], list(outs),
                                **node.params)
    np.testing.assert_allclose(host(plain[1]), np.cos(x) * x + np.sin(x))


def test_switch_with_operands():
    x = rand(4)

    def f(a):
        return total(bcf.switch(
            ew.add_p.bind(convert(gt0(a), "int32"), np.int32(1)),
            [lambda v: v, lambda v: mul(v, v), lambda v: tanh(v)], a))

    check(f, x)


def test_scan_reverse_mode_with_carry_xs_consts_and_ys():
    xs = rand(5, 3)
    w = rand(3, seed=4)

    def f(init):
        def step(carry, x):
            new = tanh(add(mul(carry, w), x))
            return new, total(mul(new, x))

        final, ys = bcf.scan(step, init, xs)
        return add(total(final), total(mul(ys, ys)))

    check(f, rand(3, seed=5))

    def g(weights):
        def step(carry, x):
            return add(mul(sin(carry), weights), x), mul(carry, 2.0)

        final, ys = bcf.scan(step, np.zeros(3), xs, reverse=True)
        return add(total(mul(final, final)), total(ys))

    check(g, w)

    def h(seq):
        def step(carry, x):
            return add(carry, total(mul(x, x))), None

        final, _ = bcf.scan(step, np.zeros((), F64), seq)
        return final

    check(h, xs)


def test_scan_rule_without_stored_residuals_recomputes_them():
    # prim.grad (the plain contract) runs the forward again; the autodiff's
    # own pass uses the residuals its forward pass stored. Same numbers.
    xs = rand(4, 3)

    def f(init):
        def step(c, x):
            return tanh(mul(c, x)), sin(c)

        return bcf.scan(step, init, xs)

    init = rand(3, seed=2)
    graph, _ = trace_flat(lambda a: list(tree_leaves(f(a))),
                          [ShapedArray((3,), F64)])
    (node,) = [n for n in graph.nodes if n.primitive.name == "scan"]
    inputs = [init] + [n_in.value for n_in in node.inputs[1:]]
    outputs = node.primitive.bind(*inputs, **node.params)
    cts = [rand(3, seed=5), rand(4, 3, seed=6)]
    plain = node.primitive.grad(cts, inputs, list(outputs), **node.params)
    _, back = autodiff.vjp(lambda a: list(tree_leaves(f(a))), init)
    (want,) = back(cts)
    np.testing.assert_allclose(host(plain[0]), host(want), rtol=1e-12)


def tree_leaves(x):
    if isinstance(x, (tuple, list)):
        return [leaf for item in x for leaf in tree_leaves(item)]
    return [x]


def test_fori_loop_with_static_bounds():
    x = rand(3)

    def f(a):
        return total(bcf.fori_loop(
            0, 4, lambda i, v: mul(sin(v), convert(add(i, np.int32(1)),
                                                   "float64")), a))

    check(f, x)


def test_while_loop_gradient_is_a_clear_error():
    def f(a):
        _, v = bcf.while_loop(lambda i, v: i < 3,
                              lambda i, v: (i + 1, mul(v, 2.0)), (0, a))
        return total(v)

    with pytest.raises(NotImplementedError, match="while_loop.*fori_loop"):
        autodiff.grad(f)(rand(3))


def test_custom_gradient_uses_the_users_backward():
    @ops.custom_gradient
    def clip_grad(v):
        def grad_fn(upstream):
            return mul(ew.clamp_p.bind(np.float64(-0.1), upstream,
                                       np.float64(0.1)), 3.0)

        return mul(v, v), grad_fn

    x = rand(4)
    g = autodiff.grad(lambda a: total(mul(clip_grad(a), 10.0)))(x)
    np.testing.assert_allclose(host(g), np.full(4, 0.3))

    @ops.custom_gradient
    def log1pexp(v):
        e = exp(v)

        def grad_fn(upstream):
            return mul(upstream, ew.logistic_p.bind(v))

        return ew.log_p.bind(add(e, 1.0)), grad_fn

    check(lambda a: total(mul(log1pexp(a), a)), x)


def test_remat_recomputes_in_the_backward_pass():
    x = rand(3)
    block = bcf.remat(lambda v: mul(tanh(v), exp(v)))
    check(lambda a: total(mul(block(a), a)), x)
    graph, _ = trace_flat(
        lambda a: [autodiff.grad(lambda v: total(block(v)))(a)],
        [ShapedArray((3,), F64)])
    names = [n.primitive.name for n in graph.nodes]
    # The forward region and its backward region are both remat nodes.
    assert names.count("remat") == 2


def test_nested_control_flow_cond_inside_scan():
    xs = rand(4, 2)

    def f(w):
        def step(c, x):
            c = bcf.cond(gt0(x), lambda: mul(c, w), lambda: add(c, w))
            return c, None

        final, _ = bcf.scan(step, np.ones(2), xs)
        return total(final)

    check(f, rand(2, seed=3) + 1.0)


def test_second_order_gradient_through_scan():
    xs = rand(4, 3)

    def f(w):
        def step(c, x):
            return tanh(add(mul(c, w), x)), None

        final, _ = bcf.scan(step, np.ones(3), xs)
        return total(mul(final, final))

    def directional(w):
        return total(mul(autodiff.grad(f)(w), np.arange(3.0)))

    check(directional, rand(3, seed=3))


def test_second_order_gradient():
    x = rand(3)
    hess_diag = autodiff.grad(
        lambda a: total(autodiff.grad(lambda b: total(mul(sin(b), b)))(a)))
    np.testing.assert_allclose(host(hess_diag(x)),
                               2 * np.cos(x) - x * np.sin(x))


# -- a Keras model ----------------------------------------------------------


def test_mlp_loss_gradient_matches_finite_differences():
    # Keras computes in float32 (it demotes float64): the finite differences
    # use a coarser step, and the tolerance is float32's.
    rng = np.random.default_rng(0)
    f32 = np.float32
    data = rng.standard_normal((6, 4)).astype(f32)
    labels = rng.integers(0, 3, 6)
    w1 = (rng.standard_normal((4, 5)) * 0.5).astype(f32)
    b1 = (rng.standard_normal(5) * 0.1).astype(f32)
    w2 = (rng.standard_normal((5, 3)) * 0.5).astype(f32)

    def loss(params):
        w1_, b1_, w2_ = params
        h = ops.relu(ops.matmul(data, w1_) + b1_)
        h = keras.activations.gelu(h)
        logits = ops.matmul(h, w2_)
        return ops.mean(keras.losses.sparse_categorical_crossentropy(
            labels, logits, from_logits=True))

    grads = autodiff.grad(loss)((w1, b1, w2))
    for i, p in enumerate((w1, b1, w2)):
        def only(v, i=i):
            params = [w1, b1, w2]
            params[i] = np.asarray(v, f32)
            return loss(tuple(params))

        assert host(grads[i]).dtype == f32
        np.testing.assert_allclose(host(grads[i]),
                                   numeric_grad(only, p, eps=1e-2),
                                   rtol=2e-2, atol=2e-3)


# -- traced backward pass ---------------------------------------------------


def test_backward_pass_traced_under_an_outer_trace_is_a_graph():
    def step(w, x):
        def loss(v):
            return total(tanh(dot.dot_general_p.bind(
                x, v, dimension_numbers=(((1,), (0,)), ((), ())))))

        value, g = autodiff.value_and_grad(loss)(w)
        return [value, sub(w, mul(g, 0.1))]

    graph, captures = trace_flat(
        step, [ShapedArray((3, 2), F64), ShapedArray((4, 3), F64)])
    text = str(graph)
    print(text)
    assert captures == []
    names = [n.primitive.name for n in graph.nodes]
    # Forward: dot_general, tanh, reduce_sum; backward: the tanh derivative
    # (1 - y^2, times the cotangent broadcast: folded into a constant) and
    # a dot_general and a transpose for w.
    # (3: the cotangent of the captured x is computed too; the compiler's
    # dead-code elimination drops it.)
    assert names.count("dot_general") == 3
    for expected in ("tanh", "reduce_sum", "transpose", "sub", "mul"):
        assert expected in names
    assert all(not isinstance(v, Tracer) for v in graph.inputs)
    w, x = rand(3, 2), rand(4, 3, seed=1)
    value, new_w = eval_graph(graph, w, x)
    np.testing.assert_allclose(host(value), np.tanh(x @ w).sum())
    g = x.T @ (1 - np.tanh(x @ w) ** 2)
    np.testing.assert_allclose(host(new_w), w - 0.1 * g)


def test_backward_of_control_flow_is_control_flow_in_the_graph():
    xs_aval = ShapedArray((5, 2), F64)

    def step(w, xs):
        def loss(v):
            def body(c, x):
                return bcf.cond(gt0(x), lambda: mul(c, v),
                                lambda: sub(c, v)), None

            final, _ = bcf.scan(body, np.ones(2), xs)
            return total(final)

        return [autodiff.grad(loss)(w)]

    graph, _ = trace_flat(step, [ShapedArray((2,), F64), xs_aval])
    names = [n.primitive.name for n in graph.nodes]
    # The forward scan (which also stacks the residuals: the carry of each
    # step and the body's values) and the reverse scan; nothing recomputes
    # the forward.
    assert names.count("scan") == 2
    forward = [n for n in graph.nodes if n.primitive.name == "scan"
               and not n.params["reverse"]][0]
    assert len(forward.outputs) > 1 + 1
    reverse = [n for n in graph.nodes if n.primitive.name == "scan"
               and n.params["reverse"]]
    assert len(reverse) == 1
    inner = [n.primitive.name for n in reverse[0].params["body"].nodes]
    assert "cond" in inner
    w, xs = rand(2) + 1.0, rand(5, 2, seed=2)

    def numeric(v):
        c = np.ones(2)
        for x in xs:
            c = c * v if x.sum() > 0 else c - v
        return c.sum()

    (g,) = eval_graph(graph, w, xs)
    np.testing.assert_allclose(host(g), numeric_grad(numeric, w), rtol=1e-6)


def test_unknown_dims_trace_a_backward_graph():
    def f(x):
        def loss(v):
            return total(mul(mul(sin(v), sin(v)), 2.0))

        return [autodiff.grad(loss)(x)]

    graph, _ = trace_flat(f, [ShapedArray((None, 3), F64)])
    assert graph.outputs[0].aval.shape == (None, 3)
    names = [n.primitive.name for n in graph.nodes]
    assert "cos" in names


# -- Keras models: every trainable variable ---------------------------------


def _conv_lstm_model():
    from keras import layers

    inp = keras.Input((8, 8, 3))
    x = layers.Conv2D(4, 3, strides=2, padding="same", activation="relu")(inp)
    x = layers.BatchNormalization()(x)
    x = layers.MaxPooling2D(2)(x)
    x = layers.DepthwiseConv2D(2, padding="same")(x)
    x = layers.Reshape((4, 4))(x)
    x = layers.LSTM(5)(x)
    x = layers.LayerNormalization()(x)
    x = layers.Dense(3)(x)
    data = np.random.default_rng(0).standard_normal((2, 8, 8, 3))
    return keras.Model(inp, x), data.astype("float32"), True


def _attention_gru_model():
    from keras import layers

    inp = keras.Input((6,), dtype="int32")
    x = layers.Embedding(10, 8)(inp)
    x = layers.MultiHeadAttention(2, 4)(x, x)
    x = layers.Dropout(0.3)(x)
    x = layers.GRU(5, return_sequences=True)(x)
    x = layers.Conv1D(4, 3, padding="causal")(x)
    x = layers.AveragePooling1D(2)(x)
    x = layers.GlobalMaxPooling1D()(x)
    x = layers.Dense(3, activation="softmax")(x)
    data = np.random.default_rng(0).integers(0, 10, (2, 6)).astype("int32")
    return keras.Model(inp, x), data, False


@pytest.mark.parametrize("build", [_conv_lstm_model, _attention_gru_model],
                         ids=["conv_bn_pool_lstm", "embed_attention_gru"])
def test_keras_model_gradients_match_finite_differences(build):
    keras.utils.set_random_seed(0)
    model, data, from_logits = build()
    labels = np.array([0, 2])
    trainable = [host(v.value) for v in model.trainable_variables]
    fixed = [v.value for v in model.non_trainable_variables]

    def loss(params):
        # Dropout's seed is in the non-trainable state: every call draws
        # the same mask.
        out, _ = model.stateless_call(params, fixed, data, training=True)
        return ops.mean(keras.losses.sparse_categorical_crossentropy(
            labels, out, from_logits=from_logits))

    grads = autodiff.grad(loss)(trainable)
    eps = 1e-3
    for k, (p, g) in enumerate(zip(trainable, grads)):
        g = host(g)
        assert g.shape == p.shape and g.dtype == p.dtype
        # The entry with the largest gradient (float32 differences of the
        # loss are too noisy for tiny ones).
        j = np.unravel_index(int(np.argmax(np.abs(g))), p.shape)

        def at(delta, k=k, j=j):
            params = [q.copy() for q in trainable]
            params[k][j] += delta
            return float(host(loss(params)))

        fd = (at(eps) - at(-eps)) / (2 * eps)
        np.testing.assert_allclose(g[j], fd, rtol=1e-2, atol=2e-4,
                                   err_msg=model.trainable_variables[k].path)
    # The same gradients traced into one graph (a compiled training step).
    graph, captures = trace_flat(
        lambda *ps: autodiff.grad(loss)(list(ps)),
        [ShapedArray(p.shape, p.dtype) for p in trainable])
    assert captures == []
    names = {n.primitive.name for n in graph.nodes}
    assert "scan" in names
    for got, want in zip(eval_graph(graph, *trainable), grads):
        np.testing.assert_allclose(host(got), host(want), rtol=1e-5,
                                   atol=1e-6)


@pytest.mark.parametrize("dtype,tol", [("float16", 2e-3), ("bfloat16", 2e-2),
                                       ("float32", 1e-6)])
def test_half_precision_gradients_keep_their_dtype(dtype, tol):
    import ml_dtypes  # noqa: F401 (registers bfloat16 with NumPy)

    dt = np.dtype(dtype)

    def f(x, w):
        h = dot.dot_general_p.bind(
            x, w, dimension_numbers=(((1,), (0,)), ((), ())))
        return total(ew.mul_p.bind(tanh(h), ew.logistic_p.bind(h)))

    x, w = rand(3, 4) * 0.5, rand(4, 2, seed=1) * 0.5
    ref = autodiff.grad(f, argnums=(0, 1))(x, w)
    got = autodiff.grad(f, argnums=(0, 1))(x.astype(dt), w.astype(dt))
    for g, want in zip(got, ref):
        assert host(g).dtype == dt
        np.testing.assert_allclose(host(g).astype(F64), host(want),
                                   atol=tol * 4, rtol=tol * 4)


# -- forward mode (jvp) by transposing reverse mode --------------------------


def _fd_jvp(fn, primals, tangents, eps=1e-6):
    plus = fn(*[p + eps * t for p, t in zip(primals, tangents)])
    minus = fn(*[p - eps * t for p, t in zip(primals, tangents)])
    return (np.asarray(plus) - np.asarray(minus)) / (2 * eps)


def _softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


@pytest.mark.parametrize(
    "fn, reference, shapes",
    [
        (lambda x: ops.sin(x) * ops.exp(-x * x),
         lambda x: np.sin(x) * np.exp(-x * x), [(5,)]),
        (lambda x, w: ops.sum(ops.tanh(ops.matmul(x, w)), axis=0),
         lambda x, w: np.tanh(x @ w).sum(axis=0), [(4, 3), (3, 2)]),
        (lambda x: ops.softmax(x, axis=-1), _softmax, [(2, 6)]),
        (lambda a: ops.linalg.qr(a)[1], lambda a: np.linalg.qr(a)[1], [(4, 3)]),
        (lambda x: ops.flip(ops.cumsum(x * x, axis=0), axis=0),
         lambda x: np.cumsum(x * x, axis=0)[::-1], [(6,)]),
    ],
    ids=["elementwise", "matmul-tanh", "softmax", "qr", "cumsum-reverse"],
)
def test_jvp_matches_finite_differences(fn, reference, shapes):
    # The device computes in float32; the reference differences in float64.
    rng = np.random.default_rng(0)
    primals = [rng.normal(size=s).astype("float32") for s in shapes]
    tangents = [rng.normal(size=s).astype("float32") for s in shapes]
    out, out_t = autodiff.jvp(fn, primals, tangents)
    np.testing.assert_allclose(np.asarray(out), reference(*primals), rtol=1e-5, atol=1e-6)
    expected = _fd_jvp(reference, [p.astype("float64") for p in primals],
                       [t.astype("float64") for t in tangents])
    np.testing.assert_allclose(np.asarray(out_t), expected, rtol=2e-4, atol=1e-5)


def test_jvp_with_aux_and_structured_outputs():
    def fn(x):
        return {"a": ops.sin(x), "b": x * x}, ops.mean(x)

    x = np.array([0.1, 0.2, 0.3])
    t = np.array([1.0, 0.0, -2.0])
    out, out_t, aux = autodiff.jvp(fn, (x,), (t,), has_aux=True)
    np.testing.assert_allclose(np.asarray(out_t["a"]), np.cos(x) * t)
    np.testing.assert_allclose(np.asarray(out_t["b"]), 2 * x * t)
    np.testing.assert_allclose(np.asarray(aux), x.mean())


def test_jvp_tangent_shape_mismatch_names_both_shapes():
    with pytest.raises(ValueError, match=r"tangent has shape \(2,\) but its primal has shape \(3,\)"):
        autodiff.jvp(ops.sin, (np.ones(3),), (np.ones(2),))


def test_jvp_under_jit_equals_eager():
    from keras_ipu.device.jit import jit

    def directional(x, t):
        return autodiff.jvp(lambda v: ops.tanh(v) ** 3, (x,), (t,))[1]

    x = np.linspace(-1, 1, 7).astype("float32")
    t = np.ones(7, "float32")
    np.testing.assert_allclose(
        np.asarray(jit(directional)(x, t)), np.asarray(directional(x, t)), rtol=1e-5
    )
