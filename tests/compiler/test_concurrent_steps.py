"""Independent steps run at once (compiler/concurrent_steps.py): a step
whose result the next one does not need is launched on a pool thread and
joined before its first dependent (a reader of its result, a kernel
writing into its operands, a kernel that splits, a barrier), giving the
bits of the one-at-a-time run; dependent, small or split steps, a cap of
one thread and a floating-point behaviour keep the program's order."""

import numpy as np
import pytest
from compiler_graphs import aval
from compiler_graphs import build
from compiler_graphs import lit

from keras_ipu.device.compiler import compile_graph
from keras_ipu.device import native
from keras_ipu.device.compiler import concurrent_steps
from keras_ipu.device.native import product_pool
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
    # These graphs' products (33 MFLOP) are sized to stay on one thread at
    # the Python pool's threshold; the C pool's is lower (threads.py).
    monkeypatch.setattr(threads, "NATIVE_FLOPS_PER_THREAD", threads.FLOPS_PER_THREAD)

    def set_cap(n):
        monkeypatch.setattr(threads, "_cap", n)
        monkeypatch.setattr(threads, "_plans", {})

    return set_cap


def _inputs(batch=64, width=512):
    return [RNG.standard_normal(s).astype(np.float32)
            for s in ((batch, width), (width, width), (batch, width))]


def _steps(exe):
    return [getattr(k, "__name__", "") for k, *_ in exe._run_program]


def _c_pool_jobs():
    """Whether a pair launches as one job of the C pool (_elementwise's
    launch_pair) here: both C modules built and current."""
    return (native.elementwise is not None and hasattr(native.elementwise, "launch_pair")
            and product_pool.tasks_available() and product_pool.available(np.float32))


def _recorded_launches(monkeypatch):
    """[(where, the launched step's kernel's name)] of each launch: "python"
    (threads.launch: a pool thread) or "c" (threads.launch_on_c_pool: a job
    the C pool's helper ran, with the results its start gave)."""
    # No back-off (a busy machine's late splits, this test's or an earlier
    # one's, would run the launches in the run loop).
    monkeypatch.setattr(threads, "backing_off", lambda: False)
    launched = []
    launch, on_c_pool = threads.launch, threads.launch_on_c_pool
    monkeypatch.setattr(threads, "launch",
                        lambda fn, args: launched.append(("python", fn.__name__))
                        or launch(fn, args))

    def recorded(start, fn, args):
        job = on_c_pool(start, fn, args)
        if type(job) is threads._OnCPool:
            launched.append(("c", fn.__name__))
        return job

    monkeypatch.setattr(threads, "launch_on_c_pool", recorded)
    return launched


def _run_alone_and_at_once(graph_fn, cap, monkeypatch, xs):
    """Results with a cap of 1 and of 2, and the run loop's step names and
    launched kernels at 2."""
    cap(1)
    alone = compile_graph(graph_fn())
    assert [k for k, *_ in alone._run_program] == [k for k, *_ in alone._program]
    want = alone.run(*[np.array(v) for v in xs])
    cap(2)
    launched = _recorded_launches(monkeypatch)
    exe = compile_graph(graph_fn())
    got = exe.run(*[np.array(v) for v in xs])
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    return got, _steps(exe), launched


def test_a_dense_layers_input_gradient_runs_beside_its_weight_gradient(cap, monkeypatch):
    # Keras' demo_functional at batch 32: 2 x 32 x 512 x 512 = 17 MFLOP
    # each, far below a split (64 MFLOP), above a launch (4 MFLOP).
    xs = _inputs(batch=32)
    got, steps, launched = _run_alone_and_at_once(lambda: _backward(batch=32), cap,
                                                  monkeypatch, xs)
    assert concurrent_steps.product_split(_backward(batch=32).nodes[0]) == (2 * 32 * 512 * 512, 1)
    # g @ w^T launched, x^T @ g beside it, the join at the end (a result).
    assert steps == ["launched", "dot_general", "joined"]
    # One job of the C pool where it is built: the product's gemm in C.
    assert launched == [("c" if _c_pool_jobs() else "python", "dot_general")]
    np.testing.assert_allclose(got[1], xs[0].T @ xs[2], rtol=1e-4, atol=1e-3)


def test_a_kernel_writing_into_a_launched_steps_operand_joins_it_first(cap, monkeypatch):
    def graph():
        def body(b, x, w, g):
            t = b.op("mul", x, lit(2.0, "float32"))
            p = b.op("dot_general", t, w, dimension_numbers=MATMUL)
            q = b.op("dot_general", g, w, dimension_numbers=MATMUL)
            # Reads t and q, not p; t's last reader: the chain writes into t.
            return [p, b.op("mul", b.op("add", t, q), t)]

        return build([aval((64, 512)), aval((512, 512)), aval((64, 512))], body)

    cap(2)
    assert compile_graph(graph()).steps[-1].params["donate"] == (0, 1)
    _, steps, launched = _run_alone_and_at_once(graph, cap, monkeypatch, _inputs())
    # The product reading t is joined before the chain overwrites t.
    assert steps == ["multiply", "launched", "dot_general", "joined", "fused_native"]
    assert launched == [("c" if _c_pool_jobs() else "python", "dot_general")]


def test_dependent_small_and_split_products_keep_their_own_steps(cap):
    cap(2)
    # The second reads the first.
    assert _steps(compile_graph(_chain())) == ["dot_general"] * 2
    # 2 x 4 x 64 x 64 FLOPs each: below a hand-off's worth.
    assert _steps(compile_graph(_backward(batch=4, width=64))) == ["dot_general"] * 2
    # 2 x 128 x 1024 x 1024 = 268 MFLOP each: each already split on its own.
    split = compile_graph(_backward(batch=128, width=1024))
    assert len(split._run_program) == 2 and "launched" not in _steps(split)
    cap(1)
    assert _steps(compile_graph(_backward())) == ["dot_general"] * 2


def test_a_floating_point_behaviour_keeps_the_program_order(cap):
    from keras_ipu.device.compiler.options import CompileOptions

    cap(2)
    exe = compile_graph(_backward(), options=CompileOptions(
        fp_behaviour=FPBehaviour(inv=True)))
    assert exe._run_program == exe._program
