"""Independent products run at once (compiler/concurrent_steps.py): a Dense
layer's input and weight gradients, paired by size when the program is
bound, give the bits of the one-at-a-time run; dependent, small or split
products, a cap of one thread and a floating-point behaviour keep one step
per node."""

import numpy as np
import pytest
from compiler_graphs import aval
from compiler_graphs import build

from keras_ipu.device.compiler import compile_graph
from keras_ipu.device.compiler import concurrent_steps
from keras_ipu.device.native import threads
from keras_ipu.device.simulator.system import FPBehaviour

RNG = np.random.default_rng(3)
MATMUL = (((1,), (0,)), ((), ()))
T_LEFT = (((0,), (0,)), ((), ()))  # x^T @ g
T_RIGHT = (((1,), (1,)), ((), ()))  # g @ w^T


def _backward(batch=64, width=512):
    """The two gradients of y = x @ w from g: g @ w^T, x^T @ g."""

    def body(b, x, w, g):
        dx = b.op("dot_general", g, w, dimension_numbers=T_RIGHT)
        dw = b.op("dot_general", x, g, dimension_numbers=T_LEFT)
        return [dx, dw]

    return build([aval((batch, width)), aval((width, width)), aval((batch, width))], body)


def _chain(batch=64, width=512):
    """Two products, the second reading the first's result."""

    def body(b, x, w, g):
        y = b.op("dot_general", x, w, dimension_numbers=MATMUL)
        return [b.op("dot_general", y, w, dimension_numbers=MATMUL)]

    return build([aval((batch, width)), aval((width, width)), aval((batch, width))], body)


@pytest.fixture
def cap(monkeypatch):
    def set_cap(n):
        monkeypatch.setattr(threads, "_cap", n)
        monkeypatch.setattr(threads, "_plans", {})

    return set_cap


def _inputs(batch=64, width=512):
    return [RNG.standard_normal(s).astype(np.float32)
            for s in ((batch, width), (width, width), (batch, width))]


def _steps(exe):
    return [getattr(k, "__name__", "") for k, *_ in exe._run_program]


def test_a_dense_layers_two_gradients_run_at_once_with_the_same_bits(cap, monkeypatch):
    xs = _inputs()
    cap(1)
    alone = compile_graph(_backward())
    assert len(alone._run_program) == 2
    want = alone.run(*[np.array(v) for v in xs])
    cap(2)
    exe = compile_graph(_backward())
    # 2 x 64 x 512 x 512 = 33.6 MFLOP each: one thread each (a product
    # splits from 2 x FLOPS_PER_THREAD = 64 MFLOP), two together.
    assert concurrent_steps.product_flops(exe.steps[0]) == 2 * 64 * 512 * 512
    assert _steps(exe) == ["concurrent_products"]
    assert len(exe._program) == 2  # the kernel list keeps one step per node
    calls = []
    pool = threads.parallel_for
    monkeypatch.setattr(threads, "parallel_for",
                        lambda fn, count, n: calls.append((count, n)) or pool(fn, count, n))
    got = exe.run(*[np.array(v) for v in xs])
    assert calls == [(2, 2)]
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    np.testing.assert_allclose(got[1], xs[0].T @ xs[2], rtol=1e-4, atol=1e-3)


def test_dependent_small_and_split_products_keep_their_own_steps(cap):
    cap(2)
    assert len(compile_graph(_chain())._run_program) == 2  # the second reads the first
    # 2 x 32 x 512 x 512 FLOPs each (demo_functional's): 34 MFLOP together,
    # not worth a second thread.
    assert len(compile_graph(_backward(batch=32))._run_program) == 2
    # 2 x 128 x 1024 x 1024 = 268 MFLOP each: each already split on its own.
    assert len(compile_graph(_backward(batch=128, width=1024))._run_program) == 2
    cap(1)
    assert len(compile_graph(_backward())._run_program) == 2


def test_a_floating_point_behaviour_keeps_the_program_order(cap):
    from keras_ipu.device.compiler.options import CompileOptions

    cap(2)
    exe = compile_graph(_backward(), options=CompileOptions(
        fp_behaviour=FPBehaviour(inv=True)))
    assert len(exe._run_program) == 2
