"""Compiled results equal eager results for functions built with keras.ops."""

import keras
import numpy as np
import pytest
from keras import ops

from keras_ipu.device.compiler import ExecutableCache
from keras_ipu.device.jit import jit
from keras_ipu.device.trace import trace_flat
from keras_ipu.device.ir import ShapedArray


def _jit(fn):
    return jit(fn, cache=ExecutableCache())


def _close(compiled, eager, rtol=1e-6, atol=1e-6):
    compiled = compiled if isinstance(compiled, (list, tuple)) else [compiled]
    eager = eager if isinstance(eager, (list, tuple)) else [eager]
    assert len(compiled) == len(eager)
    for c, e in zip(compiled, eager):
        e = keras.ops.convert_to_numpy(e)
        assert type(c) is np.ndarray
        assert c.shape == e.shape and c.dtype == e.dtype
        np.testing.assert_allclose(c, e, rtol=rtol, atol=atol)


def test_dense_relu_softmax_forward():
    rng = np.random.default_rng(0)
    w1 = rng.standard_normal((20, 16)).astype("float32") * 0.3
    b1 = rng.standard_normal(16).astype("float32")
    w2 = rng.standard_normal((16, 5)).astype("float32") * 0.3

    def forward(x, w1, b1, w2):
        h = ops.relu(ops.matmul(x, w1) + b1)
        return ops.softmax(ops.matmul(h, w2), axis=-1)

    x = rng.standard_normal((8, 20)).astype("float32")
    f = _jit(forward)
    out = f(x, w1, b1, w2)
    _close(out, forward(x, w1, b1, w2))
    np.testing.assert_allclose(out.sum(-1), 1.0, rtol=1e-5)
    names = [n.primitive.name for n in f.executable(x, w1, b1, w2).steps]
    assert "fused_elementwise" in names


def test_keras_dense_layers_closed_over():
    model = keras.Sequential(
        [keras.Input((6,)), keras.layers.Dense(8, activation="relu"),
         keras.layers.Dense(3, activation="softmax")]
    )
    x = np.random.default_rng(2).standard_normal((4, 6)).astype("float32")
    f = _jit(lambda x: model(x))
    _close(f(x), model(x), rtol=1e-5)


def test_conv_pool_forward():
    rng = np.random.default_rng(3)
    k = rng.standard_normal((3, 3, 2, 4)).astype("float32")
    bias = rng.standard_normal(4).astype("float32")

    def forward(x, k, bias):
        y = ops.conv(x, k, strides=1, padding="same") + bias
        y = ops.relu(y)
        y = ops.max_pool(y, pool_size=2, strides=2)
        return ops.average_pool(y, pool_size=2, strides=2)

    x = rng.standard_normal((2, 8, 8, 2)).astype("float32")
    f = _jit(forward)
    _close(f(x, k, bias), forward(x, k, bias), rtol=1e-5)


def test_scan():
    def cumulative(xs, scale):
        def step(carry, x):
            carry = carry * scale + x
            return carry, ops.tanh(carry)

        return ops.scan(step, ops.zeros((3,)), xs)

    xs = np.random.default_rng(4).standard_normal((6, 3)).astype("float32")
    scale = np.float32(0.5)
    f = _jit(cumulative)
    _close(list(f(xs, scale)), list(cumulative(xs, scale)))
    # The body runs compiled: a scan step lowers to a closure over an
    # Executable, not the interpreter.
    (node,) = f.executable(xs, scale).steps
    assert node.primitive.name == "scan"


def test_while_loop_and_cond():
    def fn(x):
        i, y = ops.while_loop(
            lambda i, y: i < 5, lambda i, y: (i + 1, y * 1.5), (0, x)
        )
        return ops.cond(ops.sum(y) > 0, lambda: y - 1.0, lambda: -y)

    x = np.array([1.0, -3.0], np.float32)
    f = _jit(fn)
    _close(f(x), fn(x))
    _close(f(-x), fn(-x))


def test_traces_once_per_signature_and_keeps_structure():
    f = _jit(lambda d: {"sum": d["a"] + d["b"], "pair": (d["a"] * 2, d["b"])})
    a = np.ones(3, np.float32)
    out = f({"a": a, "b": a})
    f({"a": a * 2, "b": a})
    assert f.trace_count == 1
    assert set(out) == {"sum", "pair"} and isinstance(out["pair"], tuple)
    np.testing.assert_array_equal(out["sum"], 2 * a)
    f({"a": np.ones(4, np.float32), "b": np.ones(4, np.float32)})
    assert f.trace_count == 2


def test_inlined_inside_another_trace():
    f = _jit(lambda x: ops.exp(x) + 1.0)
    graph, _ = trace_flat(lambda x: [f(x) * 2.0], [ShapedArray((3,), "float32")])
    assert [n.primitive.name for n in graph.nodes] == ["exp", "add", "mul"]
    assert f.trace_count == 0


def test_closed_over_values_are_baked_in_at_trace_time():
    w = {"v": np.float32(2.0)}
    f = _jit(lambda x: x * w["v"])
    x = np.ones(2, np.float32)
    np.testing.assert_array_equal(f(x), [2.0, 2.0])
    w["v"] = np.float32(3.0)
    np.testing.assert_array_equal(f(x), [2.0, 2.0])


def test_value_dependent_shapes_cannot_be_compiled():
    f = _jit(lambda x: ops.nonzero(x))
    with pytest.raises(NotImplementedError, match="static shapes"):
        f(np.array([0, 1, 2]))


def test_float64_program_warns_once_and_computes_in_float32():
    import warnings

    from keras_ipu.device.compiler.demotion import DemotionWarning

    def fn(x):
        y = ops.cast(x, "float64") * 3.0
        return ops.sum(ops.exp(y) + ops.cast(ops.arange(3), "float64"))

    f = _jit(fn)
    x = np.array([0.1, 0.2, 0.3])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = f(x)
        f(x)  # cached: no second compile, no second warning
    assert len([w for w in caught if w.category is DemotionWarning]) == 1
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, np.sum(np.exp(3 * x) + np.arange(3)), rtol=1e-6)


def test_python_scalars_are_32_bit_arguments():
    import warnings

    f = _jit(lambda x, s, n: x * s + ops.cast(n, "float32"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no demotion warning
        out = f(np.ones(2, np.float32), 2.5, 3)
    np.testing.assert_array_equal(out, [5.5, 5.5])
    avals = f.executable(np.ones(2, np.float32), 2.5, 3).in_avals
    assert [a.dtype.name for a in avals] == ["float32", "float32", "int32"]
