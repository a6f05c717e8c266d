"""The C pool's task interface (native/_task_pool.h) as the other C kernels
use it: fused chains split into element ranges and row sums into column
blocks (_elementwise.c), batched float32 products into blocks of batches
(_product_pool.c); each gives the one-thread (NumPy's) bits at every
thread count, and the policy (threads.chain_threads, sum_split,
product_threads) decides where they split."""

import os

import numpy as np
import pytest
from compiler_graphs import aval
from compiler_graphs import build
from compiler_graphs import lit

from keras_ipu.device import native
from keras_ipu.device.compiler.executable import Executable
from keras_ipu.device.compiler.fusion import fuse_elementwise
from keras_ipu.device.compiler import native_fusion
from keras_ipu.device.native import leading_sums
from keras_ipu.device.native import product_pool
from keras_ipu.device.native import threads

pytestmark = [pytest.mark.skipif(
    native.elementwise is None or not product_pool.tasks_available(),
    reason="no C pool or no C chains here"), pytest.mark.usefixtures("pool_not_backing_off")]
needs_blas = pytest.mark.skipif(not product_pool.available(),
                                reason="no NumPy OpenBLAS for the pool's products")
RNG = np.random.default_rng(5)


def _special(shape):
    x = RNG.standard_normal(shape).astype(np.float32)
    flat = x.reshape(-1)
    specials = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-40, -1e-40], np.float32)
    picks = RNG.random(flat.size) < 0.2
    flat[picks] = RNG.choice(specials, picks.sum())
    return x


def _adam(b, w, m, v, g, s):
    """Keras' Adam update of one variable (m, v, then w), and a tanh to
    make the chain call one of NumPy's own loops too."""
    m2 = b.op("add", m, b.op("mul", b.op("sub", g, m), lit(0.1, "float32")))
    v2 = b.op("add", v, b.op("mul", b.op("sub", b.op("mul", g, g), v), lit(0.001, "float32")))
    step = b.op("div", b.op("mul", m2, s), b.op("add", b.op("sqrt", v2), lit(1e-7, "float32")))
    return [b.op("sub", w, step), m2, v2, b.op("tanh", g)]


def _chain_program(shape, small):
    """(inputs of the fused chain of _adam, its C program)."""
    graph = fuse_elementwise(build([aval(shape)] * 4 + [aval(small)], _adam))
    (node,) = [n for n in graph.nodes if n.primitive.name == "fused_elementwise"]
    planned = native_fusion.plan(node.params["chain"], node.params["results"],
                                 [v.aval for v in node.inputs])
    assert planned is not None
    xs = tuple(
        np.asarray(v.value, np.float32) if hasattr(v, "value") else _special(v.aval.shape)
        for v in node.inputs  # the chain's literals are operands too
    )
    return xs, planned


# Sizes that are not multiples of a block; scalar, row and column operands.
@pytest.mark.parametrize("shape,small", [((517, 301), ()), ((77, 2049), (2049,)),
                                         ((300, 40, 7), (300, 1, 1))])
def test_chain_ranges_on_the_pool_give_the_one_pass_bits(shape, small):
    xs, (code, n, inner, block, allocations, _, ufuncs) = _chain_program(shape, small)
    loops = tuple(native_fusion.float32_loop(u) for u in ufuncs)
    one = tuple(np.empty(shape, np.float32) for _ in allocations)
    with np.errstate(all="ignore"):
        assert native.elementwise.run(code, n, inner, block, xs, one, 0, -1, loops) is True
        for t in (2, 3, 4, 16):
            for task in (block, 3 * block, -(-n // (2 * t * block)) * block):
                outs = tuple(np.full(shape, np.nan, np.float32) for _ in allocations)
                done = native.elementwise.run(code, n, inner, block, xs, outs, 0, -1, loops,
                                              t, task)
                assert type(done) is tuple and 0 <= done[0] <= -(-n // task)
                for got, want in zip(outs, one):
                    assert got.tobytes() == want.tobytes()


def test_a_split_chain_refuses_a_task_that_is_not_whole_blocks():
    xs, (code, n, inner, block, allocations, _, ufuncs) = _chain_program((64, 64), ())
    loops = tuple(native_fusion.float32_loop(u) for u in ufuncs)
    outs = tuple(np.empty((64, 64), np.float32) for _ in allocations)
    with pytest.raises(ValueError, match="bad header"):
        native.elementwise.run(code, n, inner, block, xs, outs, 0, -1, loops, 2, block + 1)


def test_lowered_chains_split_on_the_pool_from_the_threshold(monkeypatch):
    monkeypatch.setattr(threads, "_cap", 2)
    per = threads.NATIVE_ELEMENTS_PER_THREAD
    assert threads.chain_threads(2 * per - 1) == 1 and threads.chain_threads(2 * per) == 2
    monkeypatch.setattr(threads, "_cap", 16)
    assert threads.chain_threads(5 * per) == 5
    monkeypatch.setenv("KERAS_IPU_PRODUCT_POOL", "0")  # the Python pool's rule
    assert threads.chain_threads(5 * per) == threads.threads_for_elements(5 * per) == 1


def _lstm_cell(b, i, f, g, o, c):
    c2 = b.op("add", b.op("mul", b.op("logistic", f), c),
              b.op("mul", b.op("logistic", i), b.op("tanh", g)))
    return [c2, b.op("mul", b.op("logistic", o), b.op("tanh", c2))]


def test_transcendental_chains_split_by_their_loops_time(monkeypatch):
    # An LSTM cell's forward chain (3 logistic, 2 tanh) on the benchmark's
    # 128x128 gates: a quarter of the elements the element rule splits.
    monkeypatch.setattr(threads, "_cap", 2)
    n = 128 * 128
    graph = fuse_elementwise(build([aval((128, 128))] * 5, _lstm_cell))
    (node,) = [v for v in graph.nodes if v.primitive.name == "fused_elementwise"]
    assert native_fusion.loop_calls(node.params["chain"]) == 5
    assert threads.chain_threads(n) == 1
    assert native_fusion.chain_threads(node.params["chain"], n) == 2
    assert threads.chain_threads(n, loop_calls=1) == 1  # about 41 us: not worth a hand-off
    graph = fuse_elementwise(build([aval((128, 128))] * 2,
                                   lambda b, x, y: b.op("mul", b.op("add", x, y), y)))
    (node,) = [v for v in graph.nodes if v.primitive.name == "fused_elementwise"]
    assert native_fusion.loop_calls(node.params["chain"]) == 0


def test_an_lstm_cell_splits_on_the_pool_with_the_one_thread_bits(monkeypatch):
    # Its gates as the LSTM's scan reads them: column slices of one product,
    # read in place in every range (no copy first).
    product = RNG.standard_normal((128, 512)).astype(np.float32) * 3
    gates = [product[:, k * 128:(k + 1) * 128] for k in range(4)]
    gates.insert(2, RNG.standard_normal((128, 128)).astype(np.float32))
    graph = build([aval((128, 128))] * 5, _lstm_cell)
    results, splits = {}, []
    monkeypatch.setattr(threads, "note_pool_split",
                        lambda done, count, threads_=None: splits.append(count))
    monkeypatch.setattr(native_fusion, "_contiguous", lambda xs: pytest.fail("copied"))
    for cap in (1, 2):
        monkeypatch.setattr(threads, "_cap", cap)
        exe = Executable(fuse_elementwise(graph))
        assert [k for k in exe._kernels if getattr(k, "native", False)], str(exe)
        results[cap] = exe.run(*gates)
    assert splits and all(count > 1 for count in splits)
    for got, want in zip(results[2], results[1]):
        assert got.tobytes() == want.tobytes()


def test_an_executable_runs_a_large_chain_on_the_pool_with_the_one_thread_bits(monkeypatch):
    shape = (300, 257)
    args = [_special(shape) for _ in range(4)] + [np.asarray(0.01, np.float32)]
    args[2] = np.abs(args[2])
    graph = build([aval(shape)] * 4 + [aval(())], _adam)
    results = {}
    for cap in (1, 4):
        monkeypatch.setattr(threads, "_cap", cap)
        monkeypatch.setattr(threads, "NATIVE_ELEMENTS_PER_THREAD", 4096)
        before = product_pool.helper_count()
        exe = Executable(fuse_elementwise(graph))
        kernel = [k for k in exe._kernels if getattr(k, "native", False)]
        assert kernel
        with np.errstate(all="ignore"):
            results[cap] = exe.run(*[a.copy() for a in args])
        if cap == 4:  # the chain asked the pool for its 3 helpers
            assert product_pool.helper_count() >= max(before, 3)
    for got, want in zip(results[4], results[1]):
        assert got.tobytes() == want.tobytes()


def test_late_chain_splits_back_off_to_one_thread(monkeypatch, long_backoff):
    monkeypatch.setattr(threads, "_cap", 2)
    monkeypatch.setattr(threads, "NATIVE_ELEMENTS_PER_THREAD", 4096)
    shape = (200, 300)
    graph = fuse_elementwise(build([aval(shape)] * 4 + [aval(())], _adam))
    exe = Executable(graph)
    calls = []
    real = native.elementwise.run

    class HelperLostItsCore:  # the caller waited longer than it worked
        def run(self, *args):
            calls.append(len(args))
            done = real(*args)
            if len(args) > 9:
                return (1, done[1], done[1] + 0.01)
            return done

        def __getattr__(self, name):
            return getattr(real.__self__, name)

    monkeypatch.setattr(native, "elementwise", HelperLostItsCore())
    exe = Executable(graph)
    args = [np.abs(_special(shape)) for _ in range(4)] + [np.asarray(0.01, np.float32)]
    with np.errstate(all="ignore"):
        for _ in range(threads.LATE_SPLITS):
            exe.run(*[a.copy() for a in args])
        assert threads.backing_off()
        exe.run(*[a.copy() for a in args])
    split = [c for c in calls if c > 9]
    assert len(split) == threads.LATE_SPLITS and len(calls) == threads.LATE_SPLITS + 1


def _one_nan_sign(x):
    """x with NaNs of one sign only: where NaNs of both signs meet in an
    add (inf - inf gives x86's negative default NaN), the C loops keep
    either one depending on where a column falls in a vector (the one-
    thread kernel too; known, README)."""
    x[np.isnan(x) | (x == -np.inf)] = np.nan
    return x


@pytest.mark.parametrize("rows,cols", [(4096, 512), (999, 1000), (3000, 130)])
def test_row_sums_in_column_blocks_give_numpys_bits(rows, cols):
    x = _one_nan_sign(_special((rows, cols)))
    x[:, :3] = -0.0  # a column of -0.0 sums to +0.0, as NumPy's does
    with np.errstate(invalid="ignore"):
        want = np.add.reduce(x, axis=0)
    for t in (2, 3, 8):
        for width in (16, 64, 80, cols):
            out = np.full(cols, np.nan, np.float32)
            done = native.elementwise.sum_rows(x, out, rows, cols, t, width)
            assert type(done) is tuple
            assert out.tobytes() == want.tobytes()


def test_the_sum_policy_splits_wide_sums_only(monkeypatch):
    monkeypatch.setattr(threads, "_cap", 2)
    monkeypatch.setattr(threads, "_streaming_scales", False)  # a streaming kernel
    assert threads.sum_split(4096, 512) == (1, 512)
    monkeypatch.setattr(threads, "_streaming_scales", True)
    assert threads.sum_split(4096, 512) == (2, 128)
    assert threads.sum_split(131072, 32) == (1, 32)  # a CNN's channels: rows, Python pool
    assert threads.sum_split(128, 512) == (1, 512)  # 64k elements: one thread
    kernel = leading_sums.leading_sum_kernel(aval((64, 64, 512)), (0, 1))
    assert kernel.splits_itself
    x = _one_nan_sign(_special((64, 64, 512)))
    with np.errstate(invalid="ignore"):
        assert kernel(x).tobytes() == np.add.reduce(x, axis=(0, 1)).tobytes()


def _batched(b, m, k, n, trans_a, trans_b):
    x = RNG.standard_normal((b, k, m) if trans_a else (b, m, k)).astype(np.float32)
    y = RNG.standard_normal((b, n, k) if trans_b else (b, k, n)).astype(np.float32)
    return (x.transpose(0, 2, 1) if trans_a else x), (y.transpose(0, 2, 1) if trans_b else y)


# The transformer's attention (4 heads of 32, sequence 64) and odd shapes.
@needs_blas
@pytest.mark.parametrize("b,m,k,n", [(512, 64, 32, 64), (512, 64, 64, 32), (7, 33, 17, 129),
                                     (3, 2, 900, 5)])
@pytest.mark.parametrize("layout", ["nn", "nt", "tn"])
def test_batched_products_in_blocks_of_batches_give_numpys_bits(b, m, k, n, layout):
    x, y = _batched(b, m, k, n, layout[0] == "t", layout[1] == "t")
    want = product_pool.matmul(x, y)  # the whole product's bits (np.matmul's or our kernel's)
    for t in (2, 3, 16):
        edges = product_pool.batch_blocks(b, t, threads.BLOCKS_PER_THREAD)
        out = np.full_like(want, np.nan)
        assert product_pool.run(x, y, out, 0, edges, t) is not None
        assert out.tobytes() == want.tobytes()


@needs_blas
def test_batched_layouts_numpy_does_not_give_gemm_are_refused():
    if product_pool.native_gemm():
        pytest.skip("our kernel takes gemv's and syrk's operands as any product's")
    x, y = _batched(4, 1, 64, 64, False, False)  # m = 1: NumPy calls gemv
    edges = np.array([0, 2, 4], np.int64)
    assert product_pool.run(x, y, np.empty((4, 1, 64), np.float32), 0, edges, 2) is None
    x, _ = _batched(4, 64, 64, 64, False, False)
    # x @ x^T of each batch: NumPy's syrk
    assert product_pool.run(x, x.transpose(0, 2, 1), np.empty((4, 64, 64), np.float32), 0,
                            edges, 2) is None
    # a batched product cannot split along its columns
    assert product_pool.run(x, x.copy(), np.empty((4, 64, 64), np.float32), 1, edges,
                            2) is None


@needs_blas
def test_lowered_attention_products_split_on_the_pool(monkeypatch):
    monkeypatch.setattr(threads, "_cap", 2)
    monkeypatch.setattr(threads, "_plans", {})
    assert threads.product_threads(512, 64, 64, 32, np.float32) == 2
    plan = threads.matmul_plan(512, 64, 64, 32, np.float32)
    assert plan.__name__ == "native_split_matmul"
    x, y = _batched(512, 64, 32, 64, False, True)
    assert plan(x, y).tobytes() == product_pool.matmul(x, y).tobytes()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork")
def test_a_forked_child_splits_chains_on_its_own_helpers():
    xs, (code, n, inner, block, allocations, _, ufuncs) = _chain_program((256, 300), ())
    loops = tuple(native_fusion.float32_loop(u) for u in ufuncs)

    def split():
        outs = tuple(np.empty((256, 300), np.float32) for _ in allocations)
        with np.errstate(all="ignore"):
            native.elementwise.run(code, n, inner, block, xs, outs, 0, -1, loops, 2, block)
        return b"".join(o.tobytes() for o in outs)

    want = split()  # helpers started here
    pid = os.fork()
    if pid == 0:  # the child: no helper threads were copied
        code_ = 1
        try:
            code_ = 0 if split() == want else 2
        finally:
            os._exit(code_)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_modules_built_before_the_task_interface_are_left_alone(monkeypatch):
    # An editable install not rebuilt after an update: the old modules
    # take fewer arguments, so nothing may hand them the threads.
    class Old:
        pass

    monkeypatch.setattr(native, "elementwise", Old())
    assert not product_pool.tasks_available()
    monkeypatch.undo()
    monkeypatch.setattr(native, "split_products", Old())
    monkeypatch.setattr(product_pool, "_rules", None)
    assert not product_pool.tasks_available() and not product_pool.available()
