"""In-place updates run right after their operands (compiler/early_updates.py)
on one thread: the run loop moves each update (a fused chain writing into
the operands it donates) up to the last step it waits for, pulling small
steps it reads (a learning rate's scalars) with it, never across a step that
is not plain, and gives the program order's bits. With two threads an
update moves only where it joins the launched job of the product making its
gradient (concurrent_steps.py), with the same bits; elsewhere the order is
kept."""

import gc

import numpy as np
import pytest
from compiler_graphs import aval
from compiler_graphs import build
from compiler_graphs import lit
# The thread cap, with the 512-wide products (17 MFLOP) on one thread as
# on a host where the C product pool is off.
from test_concurrent_steps import cap  # noqa: F401 (a fixture)
from test_concurrent_steps import _c_pool_jobs
from test_concurrent_steps import _recorded_launches

from keras_ipu.device.compiler import compile_graph
from keras_ipu.device.compiler import concurrent_steps
from keras_ipu.device.compiler.early_updates import early_order
from keras_ipu.device.compiler.early_updates import is_update
from keras_ipu.device.compiler.executable import Executable
from keras_ipu.device.compiler.options import CompileOptions
from keras_ipu.device import native
from keras_ipu.device.native import product_pool
from keras_ipu.device.native import threads

RNG = np.random.default_rng(5)
T_LEFT = (((0,), (0,)), ((), ()))  # x^T @ g


def _two_layers(between="add", width=64, batch=32):
    """Two weight gradients x^T @ g, each updated in place (w - lr * dw,
    with the rate lr computed from a scalar input), the updates last as an
    optimizer emits them; `between` ("add" or "sort") is the primitive of a
    step after the second product."""

    def body(b, x, g, w1, w2, t):
        lr = b.op("mul", t, lit(0.5, "float32"))
        d1 = b.op("dot_general", x, g, dimension_numbers=T_LEFT)
        mid = b.op("sort", g, dimension=1)[0] if between == "sort" else b.op("add", g, g)
        d2 = b.op("dot_general", x, mid, dimension_numbers=T_LEFT)
        w1n = b.op("sub", w1, b.op("mul", d1, lr))
        w2n = b.op("sub", w2, b.op("mul", d2, lr))
        return [w1n, w2n]

    return build([aval((batch, width)), aval((batch, width)), aval((width, width)),
                  aval((width, width)), aval(())], body)


def _compiled(graph):
    # w1 and w2 donated, as the trainer donates the variables.
    return compile_graph(graph, options=CompileOptions(donated_inputs=(2, 3)))


def _inputs(width=64, batch=32):
    return [RNG.standard_normal(s).astype(np.float32)
            for s in ((batch, width), (batch, width), (width, width), (width, width), ())]


def _names(steps):
    return [getattr(k, "__name__", "") for k, *_ in steps]


def test_an_update_runs_right_after_its_gradient_with_the_same_bits(cap):
    cap(1)
    exe = _compiled(_two_layers())
    names = [n.primitive.name for n in exe.steps]
    updates = [i for i, n in enumerate(exe.steps) if is_update(n)]
    assert len(updates) == 2, names
    order = early_order(exe._program, exe.steps)
    first_product = names.index("dot_general")
    # The rate's scalar chain is pulled up, the first update follows the
    # first product before anything else does.
    assert order.index(updates[0]) < order.index(first_product) + 3
    assert order.index(updates[0]) < order.index(updates[1]) - 1
    assert order != list(range(len(order)))
    assert [k for k, *_ in exe._run_program] == [exe._program[i][0] for i in order]
    xs = _inputs()
    want = exe.run_steps(exe._program, [x.copy() for x in xs])
    got = exe.run(*[x.copy() for x in xs])
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    np.testing.assert_allclose(got[0], xs[2] - (xs[0].T @ xs[1]) * (xs[4] * 0.5),
                               rtol=1e-5, atol=1e-5)


def test_nothing_moves_across_a_step_that_is_not_plain(cap):
    cap(1)
    exe = _compiled(_two_layers(between="sort"))
    names = [n.primitive.name for n in exe.steps]
    sort = names.index("sort")
    order = early_order(exe._program, exe.steps)
    for i, node in enumerate(exe.steps):
        if i > sort:
            assert order.index(i) > order.index(sort), (names, order)


def test_two_threads_keep_the_order_where_no_product_is_launched(cap):
    cap(2)
    # 2 x 32 x 64 x 64 FLOPs: below a launch's worth (concurrent_steps.py).
    exe = _compiled(_two_layers())
    run_kernels = [k for k, *_ in exe._run_program]
    assert run_kernels == [k for k, *_ in exe._program]


@pytest.mark.skipif(native.elementwise is None, reason="the C elementwise kernel is not built")
def test_two_threads_run_an_update_in_its_gradients_launched_job_with_the_same_bits(
        cap, monkeypatch):
    cap(2)
    launched = _recorded_launches(monkeypatch)
    # 2 x 32 x 512 x 512 FLOPs per product (Keras' demo_functional's weight
    # gradients): worth a launch; each update in one step with its product,
    # the first launched beside the second layer's steps, the last run in
    # place (nothing after it to run beside).
    exe = _compiled(_two_layers(width=512))
    assert _names(exe._run_program)[-4:] == ["launched", "add", "paired", "joined"]
    assert exe._run_program[-4][0].launched.__name__ == "paired"
    xs = _inputs(width=512)
    want = exe.run_steps(exe._program, [x.copy() for x in xs])
    got = exe.run(*[x.copy() for x in xs])
    # One job of the C pool where it is built: the product and the chain in C.
    assert launched == [("c" if _c_pool_jobs() else "python", "paired")]
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    np.testing.assert_allclose(got[1], xs[3] - (xs[0].T @ (xs[1] + xs[1])) * (xs[4] * 0.5),
                               rtol=1e-4, atol=1e-3)


@pytest.mark.skipif(not _c_pool_jobs(), reason="the C pool's jobs are not available")
def test_a_pair_the_c_pool_refuses_runs_on_a_pool_thread_with_the_same_bits(
        cap, monkeypatch):
    cap(2)
    launched = _recorded_launches(monkeypatch)
    calls = []
    module = native.elementwise

    class Refusing:  # the C module, its launch_pair refusing the chain's operands
        def __getattr__(self, name):
            return getattr(module, name)

        @staticmethod
        def launch_pair(*args):
            calls.append(args)
            return False

    monkeypatch.setattr(native, "elementwise", Refusing())
    # A batch of its own: a program compiled before is reused as it is.
    exe = _compiled(_two_layers(width=512, batch=40))
    xs = _inputs(width=512, batch=40)
    want = exe.run_steps(exe._program, [x.copy() for x in xs])
    got = exe.run(*[x.copy() for x in xs])
    assert len(calls) == 1
    assert launched == [("python", "paired")]
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


@pytest.mark.skipif(not _c_pool_jobs(), reason="the C pool's jobs are not available")
@pytest.mark.parametrize("reused", [True, False])
def test_a_pairs_gradient_goes_to_its_threads_reused_buffer_with_the_same_bits(
        reused, cap, monkeypatch):
    """The weight gradient the update alone reads is launched as private
    (REUSED_GRADIENT: the C job may write it into its thread's reused
    buffer); off, into its own array. Both give the program order's bits."""
    cap(2)
    monkeypatch.setattr(threads, "backing_off", lambda: False)
    monkeypatch.setattr(concurrent_steps, "REUSED_GRADIENT", reused)
    calls = []
    module = native.elementwise

    class Recording:  # the C module, its launch_pair's arguments recorded
        def __getattr__(self, name):
            return getattr(module, name)

        @staticmethod
        def launch_pair(*args):
            calls.append(args)
            return module.launch_pair(*args)

    monkeypatch.setattr(native, "elementwise", Recording())
    exe = _compiled(_two_layers(width=512, batch=44 if reused else 52))
    xs = _inputs(width=512, batch=44 if reused else 52)
    want = exe.run_steps(exe._program, [x.copy() for x in xs])
    got = exe.run(*[x.copy() for x in xs])
    assert [args[-1] for args in calls] == [reused]
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


@pytest.mark.skipif(not _c_pool_jobs(), reason="the C pool's jobs are not available")
def test_a_c_pool_job_no_helper_took_is_a_late_split(monkeypatch):
    notes = []
    monkeypatch.setattr(threads, "_note_split",
                        lambda late, now, at_once=False: notes.append((late, at_once)))
    monkeypatch.setattr(threads, "_backoff", 0.0)
    monkeypatch.setattr(threads, "_cap", 2)  # on more threads a job the caller ran notes nothing
    for stats, late in (((1, 0.0, 1e-3), True), ((0, 1e-4, 1e-3), False),
                        ((0, 5e-3, 1e-3), True)):
        job = threads._OnCPool(((None, None), lambda handle: ("result", stats)), False)
        assert threads.join(job) == "result"
        assert notes.pop() == (late, False)


def test_two_threads_move_an_update_after_a_product_that_splits(cap):
    cap(2)
    # 2 x 128 x 1024 x 1024 FLOPs: split over both threads, so it runs
    # alone, and the update right after it keeps nothing from running at once.
    exe = _compiled(_two_layers(width=1024, batch=128))
    names = [n.primitive.name for n in exe.steps]
    products = [i for i, name in enumerate(names) if name == "dot_general"]
    updates = [i for i, n in enumerate(exe.steps) if is_update(n)]
    kernels = [k for k, *_ in exe._run_program]
    assert "launched" not in _names(exe._run_program)
    at = kernels.index(exe._program[products[0]][0])
    assert kernels[at + 1] is exe._program[updates[0]][0]
    xs = _inputs(width=1024, batch=128)
    want = exe.run_steps(exe._program, [x.copy() for x in xs])
    got = exe.run(*[x.copy() for x in xs])
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


def test_two_threads_keep_the_order_of_a_numpy_update(cap, monkeypatch):
    # A NumPy chain's Python would hold the run loop's interpreter lock in
    # the job: no pair, and the update stays where the program has it.
    cap(2)
    monkeypatch.setattr(native, "elementwise", None)
    exe = _compiled(_two_layers(width=512))
    assert "paired" not in [getattr(getattr(k, "launched", None), "__name__", "")
                            for k, *_ in exe._run_program]
    names = [n for n in _names(exe._run_program) if n not in ("launched", "joined")]
    assert names[-2:] == ["fused", "fused"]


@pytest.mark.numpy_engine
def test_a_keras_models_adam_updates_follow_their_gradients_with_the_same_bits(cap):
    import keras

    cap(1)
    # A width of its own: a program compiled before is reused as it is.
    model = keras.Sequential([keras.Input((23,)), keras.layers.Dense(64, activation="relu"),
                              keras.layers.Dense(64), keras.layers.Dense(5)])
    model.compile(optimizer="adam", loss="mse")
    x = RNG.standard_normal((32, 23)).astype(np.float32)
    model.fit(x, np.zeros((32, 5), np.float32), batch_size=32, epochs=1, verbose=0)
    step = max((o for o in gc.get_objects() if isinstance(o, Executable)
                and any(v.aval.shape == (23, 64) for v in o.graph.inputs)),
               key=lambda e: len(e._program))
    nodes = step.steps
    updates = [i for i, n in enumerate(nodes) if is_update(n)
               and n.outputs[0].aval.shape == (64, 64)]
    assert updates
    order = early_order(step._program, nodes)
    for u in updates:
        # Its gradient: the (64, 64) product it reads.
        grad = next(i for i, n in enumerate(nodes) if n.primitive.name == "dot_general"
                    and any(v in n.outputs for v in nodes[u].inputs))
        assert order.index(u) <= order.index(grad) + 2
    assert [k for k, *_ in step._run_program] == [step._program[i][0] for i in order]
    xs = [RNG.uniform(0.01, 0.1, a.shape).astype(a.dtype) for a in step.in_avals]
    with np.errstate(all="ignore"):
        want = step.run_steps(step._program, [a.copy() for a in xs])
        got = step.run_unchecked([a.copy() for a in xs])
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


PLAIN = (((1,), (0,)), ((), ()))  # x @ w


def _gradient_beside_products(caller_products=True):
    """A weight gradient x^T @ g (32 x 512 x 512: 17 MFLOP, split in two
    on the C pool at two threads) updated in place, and, with
    `caller_products`, two 8 MFLOP products of g the run loop runs itself
    (each under a split's worth, their results outputs); without, an add."""

    def body(b, x, g, w, v1, v2, t):
        lr = b.op("mul", t, lit(0.5, "float32"))
        dw = b.op("dot_general", x, g, dimension_numbers=T_LEFT)
        if caller_products:
            h = b.op("dot_general", b.op("dot_general", g, v1, dimension_numbers=PLAIN), v2,
                     dimension_numbers=PLAIN)
        else:
            h = b.op("add", g, g)
        return [b.op("sub", w, b.op("mul", dw, lr)), h]

    return build([aval((32, 512)), aval((32, 512)), aval((512, 512)), aval((512, 256)),
                  aval((256, 512)), aval(())], body)


def _beside_inputs():
    return [RNG.standard_normal(s).astype(np.float32)
            for s in ((32, 512), (32, 512), (512, 512), (512, 256), (256, 512), ())]


@pytest.fixture
def two_threads_with_the_c_pool(monkeypatch):
    monkeypatch.setattr(threads, "_cap", 2)
    monkeypatch.setattr(threads, "_backoff", 0.0)  # splits on the pool
    if native.elementwise is None or not threads.product_pool_takes(0, np.float32):
        pytest.skip("the C product pool or the C elementwise kernel is not available")
    product = _gradient_beside_products().nodes[1]
    assert product.primitive.name == "dot_general"
    if concurrent_steps.product_split(product) != (32 * 512 * 512 * 2, 2):
        pytest.skip("this host's product pool does not split the 17 MFLOP gradient in two")


def test_a_product_that_splits_in_two_runs_whole_with_its_update_beside_the_run_loops(
        two_threads_with_the_c_pool, monkeypatch):
    launched = _recorded_launches(monkeypatch)
    splits = []
    run = product_pool.run
    monkeypatch.setattr(product_pool, "run",
                        lambda *args: splits.append(args[2].shape) or run(*args))
    exe = _compiled(_gradient_beside_products())
    assert _names(exe._run_program).count("launched") == 1
    paired = exe._run_program[_names(exe._run_program).index("launched")][0].launched
    assert paired.__name__ == "paired"
    assert paired.stands_for_a_split  # it backs off as the split does (threads.launch)
    xs = _beside_inputs()
    want = exe.run_steps(exe._program, [x.copy() for x in xs])
    assert splits == [(512, 512)]  # in program order the gradient splits
    del splits[:]
    got = exe.run(*[x.copy() for x in xs])
    assert launched == [("c" if _c_pool_jobs() else "python", "paired")]
    assert splits == []  # the gradient ran whole, on one thread
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    np.testing.assert_allclose(got[0], xs[2] - (xs[0].T @ xs[1]) * (xs[5] * 0.5),
                               rtol=1e-4, atol=1e-3)


def test_a_product_that_splits_in_two_splits_where_the_run_loop_has_no_product_beside(
        two_threads_with_the_c_pool):
    exe = _compiled(_gradient_beside_products(caller_products=False))
    assert "launched" not in _names(exe._run_program)
    products = [i for i, n in enumerate(exe.steps) if n.primitive.name == "dot_general"]
    update = next(i for i, n in enumerate(exe.steps) if is_update(n))
    kernels = [k for k, *_ in exe._run_program]
    # The split product as it is, its update right after it (it runs alone).
    at = kernels.index(exe._program[products[0]][0])
    assert kernels[at + 1] is exe._program[update][0]
    xs = _beside_inputs()
    want = exe.run_steps(exe._program, [x.copy() for x in xs])
    got = exe.run(*[x.copy() for x in xs])
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


@pytest.mark.skipif(not _c_pool_jobs(), reason="the C pool's jobs are not available")
def test_a_c_chain_launched_alone_runs_on_the_c_pool_with_the_same_bits(cap, monkeypatch):
    cap(2)
    launched = _recorded_launches(monkeypatch)

    def body(b, a, c, x, w):
        # 64k elements: worth a launch, on one thread (chain_threads); the
        # product after it runs beside it.
        chained = b.op("add", b.op("mul", a, c), a)
        return [chained, b.op("dot_general", x, w, dimension_numbers=PLAIN)]

    shapes = ((128, 512), (128, 512), (48, 512), (512, 512))
    exe = compile_graph(build([aval(s) for s in shapes], body))
    assert _names(exe._run_program) == ["launched", "dot_general", "joined"]
    xs = [RNG.standard_normal(s).astype(np.float32) for s in shapes]
    want = exe.run_steps(exe._program, [x.copy() for x in xs])
    got = exe.run(*[x.copy() for x in xs])
    assert launched == [("c", "fused_native")]
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    np.testing.assert_array_equal(got[0], xs[0] * xs[1] + xs[0])


def _gradient_beside_small_steps():
    """The weight gradient of _gradient_beside_products updated in place,
    beside six small kernels of the run loop's own (reductions of g: a
    step's tail of bias gradients and small updates) and no product."""

    def body(b, x, g, w, t):
        lr = b.op("mul", t, lit(0.5, "float32"))
        dw = b.op("dot_general", x, g, dimension_numbers=T_LEFT)
        small = [b.op(name, g, axes=(axis,))
                 for name in ("reduce_sum", "reduce_max", "reduce_min") for axis in (0, 1)]
        return [b.op("sub", w, b.op("mul", dw, lr)), *small]

    return build([aval((32, 512)), aval((32, 512)), aval((512, 512)), aval(())], body)


def test_a_product_that_splits_in_two_runs_whole_beside_the_run_loops_small_kernels(
        two_threads_with_the_c_pool, monkeypatch):
    # No product beside it, but six small kernels: each costs the run loop
    # about a small kernel's call (concurrent_steps.STEP_FLOPS) and its
    # elements, together more than half the gradient's product.
    launched = _recorded_launches(monkeypatch)
    graph = _gradient_beside_small_steps()
    exe = compile_graph(graph, options=CompileOptions(donated_inputs=(2,)))
    assert _names(exe._run_program).count("launched") == 1
    assert exe._run_program[_names(exe._run_program).index("launched")][0].launched.__name__ \
        == "paired"
    rng = np.random.default_rng(3)
    xs = [rng.standard_normal(s).astype(np.float32) for s in ((32, 512), (32, 512), (512, 512), ())]
    want = exe.run_steps(exe._program, [x.copy() for x in xs])
    got = exe.run(*[x.copy() for x in xs])
    assert launched == [("c" if _c_pool_jobs() else "python", "paired")]
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    # Counted as products only (the rule before), they are not enough.
    monkeypatch.setattr(concurrent_steps, "STEP_FLOPS", 0)
    monkeypatch.setattr(concurrent_steps, "ELEMENT_FLOPS", 0)
    exe = compile_graph(graph, options=CompileOptions(donated_inputs=(2,)))
    assert "launched" not in _names(exe._run_program)


def test_a_product_split_in_a_row_tail_runs_on_one_thread_beside_a_launched_job(
        two_threads_with_the_c_pool, monkeypatch):
    # 32 x 512 @ 512 x 512 splits in 24 and 8 rows (threads.row_tail_split):
    # before anything is launched it splits; while the weight gradient's
    # job holds the helper it runs on one thread, and joins nothing.
    if threads.row_tail_split(32, 512, 512, np.float32) is None:
        pytest.skip("rows split anywhere on this BLAS: no row tail")

    def body(b, x, g, w, v, t):
        lr = b.op("mul", t, lit(0.5, "float32"))
        h0 = b.op("dot_general", x, v, dimension_numbers=PLAIN)
        dw = b.op("dot_general", x, g, dimension_numbers=T_LEFT)
        h1 = b.op("dot_general", g, v, dimension_numbers=PLAIN)
        return [b.op("sub", w, b.op("mul", dw, lr)), h0, h1]

    graph = build([aval((32, 512)), aval((32, 512)), aval((512, 512)), aval((512, 512)),
                   aval(())], body)
    splits = []
    run = product_pool.run
    monkeypatch.setattr(product_pool, "run",
                        lambda *args: splits.append(args[4].tolist()) or run(*args))
    # Late splits of a busy machine would make the split run whole.
    monkeypatch.setattr(threads, "backing_off", lambda: False)
    exe = compile_graph(graph, options=CompileOptions(donated_inputs=(2,)))
    names = _names(exe._run_program)
    assert names.count("launched") == 1 and names.count("joined") == 1
    launch, join = names.index("launched"), names.index("joined")
    products = [i for i, n in enumerate(exe.steps) if n.primitive.name == "dot_general"]
    h0, h1 = exe._program[products[0]][0], exe._program[products[2]][0]
    kernels = [k for k, *_ in exe._run_program]
    assert kernels.index(h0) < launch
    assert h1 not in kernels and launch < kernels.index(h1.one_thread) < join
    rng = np.random.default_rng(4)
    xs = [rng.standard_normal(s).astype(np.float32)
          for s in ((32, 512), (32, 512), (512, 512), (512, 512), ())]
    want = exe.run_steps(exe._program, [x.copy() for x in xs])
    del splits[:]
    got = exe.run(*[x.copy() for x in xs])
    assert splits == [[0, 24, 32]]  # h0 only
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


def test_with_wide_splits_a_weight_gradient_splits_wide_and_its_update_follows_it(
        two_threads_with_the_c_pool, monkeypatch):
    """On a host of many threads (threads.wide_splits) the 17 MFLOP weight
    gradient splits over more than two threads instead of running whole
    beside the run loop in a job with its update: no launch, its update
    right after it, the program order's bits."""
    monkeypatch.setattr(threads, "_cap", threads.WIDE_MIN_THREADS)
    monkeypatch.delenv("KERAS_IPU_WIDE_SPLITS", raising=False)
    product = _gradient_beside_products().nodes[1]
    flops, split = concurrent_steps.product_split(product)
    if split <= 2:
        pytest.skip("this host's rule keeps the gradient from more than two blocks")
    launched = _recorded_launches(monkeypatch)
    splits = []
    run = product_pool.run
    # Each split product's output shape and edges: on a host whose BLAS
    # splits columns anywhere (OpenBLAS' SkylakeX kernels) the two 8 MFLOP
    # products split wide too; the gradient is the (512, 512) one.
    monkeypatch.setattr(product_pool, "run", lambda *args: splits.append(
        (args[2].shape, args[4].tolist())) or run(*args))
    exe = _compiled(_gradient_beside_products())
    assert "launched" not in _names(exe._run_program)
    products = [i for i, n in enumerate(exe.steps) if n.primitive.name == "dot_general"]
    update = next(i for i, n in enumerate(exe.steps) if is_update(n))
    kernels = [k for k, *_ in exe._run_program]
    assert kernels[kernels.index(exe._program[products[0]][0]) + 1] is exe._program[update][0]
    xs = _beside_inputs()
    want = exe.run_steps(exe._program, [x.copy() for x in xs])
    del splits[:]
    got = exe.run(*[x.copy() for x in xs])
    assert launched == []
    gradient = [edges for shape, edges in splits if shape == (512, 512)]
    assert len(gradient) == 1 and len(gradient[0]) - 1 > 2  # the gradient, wide
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    # The same host with wide splits off: the job with its update, as on two threads.
    monkeypatch.setenv("KERAS_IPU_WIDE_SPLITS", "0")
    exe = _compiled(_gradient_beside_products())
    assert _names(exe._run_program).count("launched") == 1
