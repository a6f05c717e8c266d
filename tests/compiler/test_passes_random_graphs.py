"""All passes together on random graphs: the optimized graph computes the
same values, in a valid order (the interpreter fails on a value read
before it is made)."""

import numpy as np
import pytest
from compiler_graphs import aval
from compiler_graphs import build
from compiler_graphs import lit
from compiler_graphs import run

from keras_ipu.device.compiler import compile_graph
from keras_ipu.device.compiler import optimize

SHAPE = (4, 3)


def _random_graph(seed):
    rng = np.random.default_rng(seed)

    def body(b, x, y):
        values = [x, y]
        for _ in range(rng.integers(3, 14)):
            kind = rng.integers(0, 7)
            a = values[rng.integers(len(values))]
            c = values[rng.integers(len(values))]
            if kind == 0:
                v = b.op("tanh", a)
            elif kind == 1:
                v = b.op("add", a, c)
            elif kind == 2:
                v = b.op("mul", a, c)
            elif kind == 3:
                v = b.op("max", a, lit(0.1, "float32"))
            elif kind == 4:
                r = b.op("reduce_sum", a, axes=(1,))
                v = b.op("sub", a, b.op("reshape", r, new_shape=(4, 1)))
            elif kind == 5:
                v = b.op("neg", b.op("exp", b.op("tanh", a)))
            else:
                v = b.op("mul", a, lit(np.float32(0.5) * np.ones(3, np.float32)))
            values.append(v)
        k = rng.integers(1, 4)
        picks = rng.choice(len(values), size=k, replace=True)
        return [values[i] for i in picks]

    return build([aval(SHAPE), aval(SHAPE)], body)


@pytest.mark.parametrize("seed", range(60))
def test_optimized_random_graph_matches(seed):
    g = _random_graph(seed)
    rng = np.random.default_rng(1000 + seed)
    x = rng.standard_normal(SHAPE).astype(np.float32)
    y = rng.standard_normal(SHAPE).astype(np.float32)
    x0, y0 = x.copy(), y.copy()
    want = run(g, x, y)
    optimized, _ = optimize(g)
    for got, w in zip(run(optimized, x, y), want):
        np.testing.assert_allclose(got, w, rtol=1e-5, atol=1e-6)
    for got, w in zip(compile_graph(g).run(x, y), want):
        assert got.shape == w.shape and got.dtype == w.dtype
        np.testing.assert_allclose(got, w, rtol=1e-5, atol=1e-6)
    # Inputs are never written into.
    np.testing.assert_array_equal(x, x0)
    np.testing.assert_array_equal(y, y0)


def test_random_graphs_do_get_fused():
    fused = sum(
        any(n.primitive.name == "fused_elementwise" for n in optimize(_random_graph(s))[0].nodes)
        for s in range(60)
    )
    assert fused >= 30
