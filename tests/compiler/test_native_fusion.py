"""The C kernel for fused elementwise chains (native_fusion.py,
native/_elementwise.c) against the NumPy kernel it replaces: the same bits
on every value (NaN, infinities, -0.0), every operand layout, donation,
and the run-time fallback."""

import numpy as np
import pytest
from compiler_graphs import aval
from compiler_graphs import build
from compiler_graphs import lit

from keras_ipu.device import native
from keras_ipu.device.compiler import host_memory
from keras_ipu.device.compiler import native_fusion
from keras_ipu.device.compiler.executable import Executable
from keras_ipu.device.compiler.fusion import fuse_elementwise

needs_native = pytest.mark.skipif(
    native.elementwise is None, reason="the C extension is not built here"
)
_rng = np.random.default_rng(11)


def _special(shape):
    """Normal values with NaN, +-inf, +-0.0 and ties mixed in."""
    x = _rng.standard_normal(shape).astype(np.float32)
    flat = x.reshape(-1)
    specials = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0], np.float32)
    picks = _rng.random(flat.size) < 0.3
    flat[picks] = _rng.choice(specials, picks.sum())
    return x


def _numpy_executable(graph):
    """The Executable of `graph` lowered without the C kernel."""
    saved = native.elementwise
    native.elementwise = None
    try:
        return Executable(graph)
    finally:
        native.elementwise = saved


def _both(graph, *args):
    """(native results, NumPy results, the native Executable)."""
    fused = fuse_elementwise(graph)
    with_c = Executable(fused)
    without = _numpy_executable(fused)
    copies = [np.array(a, copy=True) for a in args]
    return with_c.run(*args), without.run(*copies), with_c


def _assert_same_bits(got, want):
    """Equal values, NaN where NumPy has NaN, and the sign of every number
    (-0.0 included). Not the sign of a NaN: IEEE 754 (6.3) does not
    interpret it, x86 returns the first operand's NaN of two, which the C
    compiler may commute, and NumPy's own loops differ (array + array
    gives the first operand's NaN, array + scalar the scalar's)."""
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_array_equal(g, w)
        if g.dtype.kind == "f":
            numbers = ~np.isnan(w)
            np.testing.assert_array_equal(np.signbit(g[numbers]), np.signbit(w[numbers]))


def _agrees(body, *args):
    """Builds the graph of `body` over arrays like `args`, checks that the C
    and NumPy kernels give the same bits; returns the C-backed Executable."""
    graph = build([aval(a.shape, a.dtype.name) for a in args], body)
    got, want, exe = _both(graph, *args)
    _assert_same_bits(got, want)
    return exe


def _no_fallback(*xs):
    pytest.fail("fell back to NumPy")


_no_fallback.source = ""


def _uses_native(exe):
    return any(getattr(k, "native", False) for k in exe._kernels)


@needs_native
@pytest.mark.parametrize("op", ["add", "sub", "mul", "div", "max", "min"])
def test_binary_ops_give_numpys_bits(op):
    def body(b, x, y):  # times 1: a chain of two, which fusion takes
        return b.op("mul", b.op(op, x, y), lit(1.0, "float32"))

    shape = (37, 129)  # not a multiple of any block size
    x, y = _special(shape), _special(shape)
    assert _uses_native(_agrees(body, x, y))


@needs_native
@pytest.mark.parametrize("op", ["neg", "abs", "sqrt", "square", "reciprocal", "floor", "ceil"])
def test_unary_ops_give_numpys_bits(op):
    def body(b, x):
        return b.op("mul", b.op(op, x), lit(1.0, "float32"))

    x = _special((1000,)) * np.float32(7.3)
    assert _uses_native(_agrees(body, x))


@needs_native
def test_relu_and_its_derivative_mask_with_comparisons_and_selects():
    # What the MLP's forward pass fuses: bias add, relu, and the 0/0.5/1
    # derivative mask (ties split) kept for the backward pass.
    def body(b, x, bias):
        y = b.op("add", x, bias)
        relu = b.op("max", y, lit(0.0, "float32"))
        gt = b.op("gt", y, lit(0.0, "float32"))
        eq = b.op("eq", y, lit(0.0, "float32"))
        half = b.op("select", eq, lit(0.5, "float32"), lit(0.0, "float32"))
        mask = b.op("select", gt, lit(1.0, "float32"), half)
        return [relu, mask, b.op("ne", y, y)]

    x, bias = _special((64, 300)), _special((300,))
    assert _uses_native(_agrees(body, x, bias))


@needs_native
def test_bool_logic_and_conversions():
    def body(b, x, y):
        p = b.op("lt", x, y)
        q = b.op("ge", x, lit(0.5, "float32"))
        both = b.op("and", p, q)
        either = b.op("or", p, b.op("not", q))
        odd = b.op("xor", p, b.op("logical_not", b.op("logical_not", q)))
        as_float = b.op("convert_element_type", either, dtype=np.dtype("float32"))
        back = b.op("convert_element_type", x, dtype=np.dtype("bool"))
        chosen = b.op("select", odd, both, back)
        return [b.op("mul", as_float, y), chosen]

    x, y = _special((50, 70)), _special((50, 70))
    assert _uses_native(_agrees(body, x, y))


@needs_native
@pytest.mark.parametrize(
    "small",
    [(), (1,), (1, 1, 9), (9,), (5, 1, 1), (5, 7, 1), (1, 7, 9), (5, 1, 9)],
)
def test_operand_layouts_scalar_row_column_and_unsupported(small):
    def body(b, x, s):
        return b.op("sub", b.op("mul", x, s), s)

    shape = (5, 7, 9)
    x, s = _special(shape), _special(small)
    # (5, 1, 9) repeats neither along leading nor trailing axes only: NumPy.
    assert _uses_native(_agrees(body, x, s)) == (small != (5, 1, 9))


@needs_native
def test_optimizer_update_writes_into_the_donated_gradient():
    # SGD momentum (the MLP's update): the gradient, a fresh product nobody
    # else reads, is donated; the C kernel writes a result into it.
    def body(b, x, w, m, lr):
        g = b.op("dot_general", x, w, dimension_numbers=(((0,), (0,)), ((), ())))
        new_m = b.op("sub", b.op("mul", m, lit(0.9, "float32")), b.op("mul", g, lr))
        return [new_m, b.op("add", b.op("mul", g, lit(2.0, "float32")), new_m)]

    x, w, m = _special((8, 40)), _special((8, 30)), _special((40, 30))
    x, w = np.nan_to_num(x), np.nan_to_num(w)
    lr = np.asarray(0.01, np.float32)
    graph = build([aval((8, 40)), aval((8, 30)), aval((40, 30)), aval(())], body)
    got, want, exe = _both(graph, x, w, m, lr)
    node = [n for n in exe.steps if n.primitive.name == "fused_elementwise"][0]
    assert node.params["donate"]
    _assert_same_bits(got, want)


@needs_native
def test_direct_write_waits_for_the_last_read_of_a_donated_operand():
    # Step 0's result goes into donated operand 0, which step 1 still reads:
    # it is copied there at the end of each block, not written at once.
    from keras_ipu.device.primitives.registry import REGISTRY

    a, s = aval((3000,)), aval(())
    chain = (
        (REGISTRY["mul"], (), (("in", 0, a), ("in", 1, s)), a),
        (REGISTRY["add"], (), (("t", 0, a), ("in", 0, a)), a),
    )
    planned = native_fusion.plan(chain, (0, 1), (a, s), donate=(0,))
    code = np.frombuffer(planned[0], np.int32)
    assert planned[4] == ((0, np.dtype("float32")), (None, np.dtype("float32")))
    assert list(code[-4:]) == [2, 0, 3, 1]  # (register, direct) per output

    kernel = native_fusion.native_kernel(chain, (0, 1), (a, s), (0,), _no_fallback)
    x = _special((3000,))
    three = np.asarray(3.0, np.float32)
    donated = x.copy()
    got = kernel(donated, three)
    assert got[0] is donated
    _assert_same_bits(list(got), [x * three, x * three + x])


@needs_native
def test_an_operand_returned_as_it_is_is_never_overwritten():
    # Result 0 is operand 0 itself (a same-dtype convert); result 1 must not
    # be written into operand 0 even though it is donated.
    from keras_ipu.device.primitives.registry import REGISTRY

    a = aval((500,))
    chain = (
        (REGISTRY["convert_element_type"], (("dtype", np.dtype("float32")),),
         (("in", 0, a),), a),
        (REGISTRY["mul"], (), (("in", 0, a), ("in", 1, a)), a),
    )
    planned = native_fusion.plan(chain, (0, 1), (a, a), donate=(0, 1))
    assert 0 not in [into for into, _ in planned[4]]
    kernel = native_fusion.native_kernel(chain, (0, 1), (a, a), (0, 1), _no_fallback)
    x, y = _special((500,)), _special((500,))
    got = kernel(x.copy(), y.copy())
    with np.errstate(all="ignore"):
        want = [x, x * y]
    _assert_same_bits(list(got), want)


@needs_native
@pytest.mark.numpy_engine
def test_views_and_foreign_buffers_fall_back_to_numpy():
    def body(b, x, y):
        return b.op("add", b.op("mul", x, y), lit(1.0, "float32"))

    x, y = _special((30, 40)), _special((30, 40))
    fused = fuse_elementwise(build([aval((30, 40)), aval((30, 40))], body))
    exe = Executable(fused)
    assert _uses_native(exe)
    strided = np.asfortranarray(x)  # same values, not C-contiguous
    (got,) = exe.run(strided, y)
    with np.errstate(all="ignore"):
        want = x * y + np.float32(1.0)
    _assert_same_bits([got], [want])


def test_plan_leaves_inexact_or_other_dtype_chains_to_numpy():
    from keras_ipu.device.primitives.registry import REGISTRY

    f32, f64, i32 = aval((100,)), aval((100,), "float64"), aval((100,), "int32")
    # asin's kernel is no ufunc whose float32 loop the C kernel could call.
    asin = ((REGISTRY["asin"], (), (("in", 0, f32),), f32),)
    assert native_fusion.plan(asin, (0,), (f32,)) is None
    exp64 = ((REGISTRY["exp"], (), (("in", 0, f64),), f64),)
    assert native_fusion.plan(exp64, (0,), (f64,)) is None
    add64 = ((REGISTRY["add"], (), (("in", 0, f64), ("in", 0, f64)), f64),)
    assert native_fusion.plan(add64, (0,), (f64,)) is None
    addi = ((REGISTRY["add"], (), (("in", 0, i32), ("in", 0, i32)), i32),)
    assert native_fusion.plan(addi, (0,), (i32,)) is None
    add = ((REGISTRY["add"], (), (("in", 0, f32), ("in", 0, f32)), f32),)
    assert native_fusion.plan(add, (0,), (f32,)) is not None


@needs_native
def test_printed_program_says_which_chains_run_in_c():
    def body(b, x):
        return b.op("mul", b.op("add", x, x), x)

    g = build([aval((4, 4))], body)
    text = str(Executable(fuse_elementwise(g)))
    assert "runs in one pass, in C" in text
    g = build([aval((4, 4))], lambda b, x: b.op("asin", b.op("add", x, x)))
    assert "in C" not in str(Executable(fuse_elementwise(g)))


def test_numpy_kernel_never_reuses_a_buffer_a_convert_returned():
    # Same hazard on the NumPy path, inside one chain: `c` is the product
    # `t` itself (a same-dtype convert returns its operand); the step after
    # it must not write into t's buffer.
    def body(b, x, y):
        t = b.op("mul", x, y)
        c = b.op("convert_element_type", t, dtype=np.dtype("float32"))
        return [c, b.op("mul", t, lit(3.0, "float32"))]

    exe = _numpy_executable(fuse_elementwise(build([aval((300,)), aval((300,))], body)))
    assert [n.primitive.name for n in exe.steps] == ["fused_elementwise"]
    x, y = _special((300,)), _special((300,))
    with np.errstate(all="ignore"):
        want = [x * y, x * y * np.float32(3.0)]
    _assert_same_bits(exe.run(x, y), want)


@needs_native
@pytest.mark.parametrize("small", [(), (1, 1, 24), (40, 1, 1)])
@pytest.mark.parametrize("c_pool", ["1", "0"])
def test_large_chains_split_over_threads_give_the_same_bits(small, c_pool, monkeypatch):
    from keras_ipu.device.native import threads

    # Four threads, and a "large" chain from a few thousand elements: the
    # chain runs as several element ranges (scalar, row and column
    # operands included), with NumPy's bits, on the C pool or (without
    # it) the Python pool.
    monkeypatch.setenv("KERAS_IPU_PRODUCT_POOL", c_pool)
    monkeypatch.setattr(threads, "_cap", 4)
    monkeypatch.setattr(threads, "ELEMENTS_PER_THREAD", 1000)
    monkeypatch.setattr(threads, "NATIVE_ELEMENTS_PER_THREAD", 1000)
    calls = []
    real_ranges = threads.ranges
    monkeypatch.setattr(threads, "ranges",
                        lambda *a: calls.append(real_ranges(*a)) or calls[-1])

    def body(b, x, s):
        y = b.op("sub", b.op("mul", x, s), s)
        return [y, b.op("max", y, lit(0.0, "float32"))]

    exe = _agrees(body, _special((40, 31, 24)), _special(small))
    assert _uses_native(exe)
    assert calls and len(calls[-1]) > 1


@needs_native
def test_returned_results_are_aligned_as_tensorflows_tensors():
    # A momentum update returns the new momentum and weights: arrays the
    # TensorFlow front end hands to tf.Variables, which take them without
    # a copy only when 64-byte aligned (host_memory.py). malloc aligns to
    # 16: ten arrays aligned by chance would be about one run in a million.
    def body(b, w, m, g):
        new_m = b.op("sub", b.op("mul", m, lit(0.9, "float32")),
                     b.op("mul", g, lit(0.01, "float32")))
        return [b.op("add", w, new_m), new_m]

    shape = (130, 257)  # 133,640 bytes: above ALIGN_MIN_BYTES
    args = [_rng.standard_normal(shape).astype(np.float32) for _ in range(3)]
    exe = _agrees(body, *args)
    assert _uses_native(exe)
    for _ in range(5):
        for out in exe.run(*args):
            assert out.ctypes.data % host_memory.ALIGNMENT == 0
            assert out.flags.writeable and out.flags.c_contiguous


def test_empty_aligned_gives_plain_arrays_below_the_threshold():
    big = host_memory.empty_aligned((3, 64, 129), np.float32)
    assert big.shape == (3, 64, 129) and big.dtype == np.float32
    assert big.ctypes.data % host_memory.ALIGNMENT == 0 and big.flags.c_contiguous
    big[...] = 1.5  # writable, its own memory
    assert big.sum() == 1.5 * big.size
    small = host_memory.empty_aligned((4, 4), np.int32)
    assert small.shape == (4, 4) and small.dtype == np.int32 and small.base is None


def _output_modes(code):
    """Per output buffer of a planned chain: 0 copied, 1 direct, 2 streamed."""
    words = np.frombuffer(code, np.int32)
    return [int(m) for m in words[len(words) - 2 * words[3] + 1::2]]


@needs_native
def test_returned_results_read_by_nothing_later_are_streamed(monkeypatch):
    # The new weights go back to the caller and nothing reads them again:
    # written with non-temporal stores (no read of the lines they replace).
    # The new momentum is read again by the sum after the chain: it stays
    # an ordinary store, so the sum finds it in the cache.
    from keras_ipu.device.compiler import fusion

    seen = []
    original = fusion.native_kernel

    def noting(chain, results, in_avals, donate, fallback, aligned=(), streamed=()):
        kernel = original(chain, results, in_avals, donate, fallback, aligned, streamed)
        if kernel is not None:  # not the NumPy-only reference's
            code = native_fusion.plan(chain, results, in_avals, donate, streamed)[0]
            seen.append((chain, results, aligned, streamed, _output_modes(code)))
        return kernel

    monkeypatch.setattr(fusion, "native_kernel", noting)

    def body(b, w, m, g):
        new_m = b.op("sub", b.op("mul", m, lit(0.9, "float32")),
                     b.op("mul", g, lit(0.01, "float32")))
        new_w = b.op("add", w, new_m)
        return [new_w, new_m, b.op("reduce_sum", new_m, axes=(0, 1))]

    shape = (131, 257)  # 134,668 bytes: aligned, and not a whole number of blocks
    args = [_rng.standard_normal(shape).astype(np.float32) for _ in range(3)]
    exe = _agrees(body, *args)
    assert _uses_native(exe)
    (chain, results, aligned, streamed, modes), = seen
    kinds = {chain[j][0].name: pos for pos, j in enumerate(results)}
    assert set(aligned) == {kinds["add"], kinds["sub"]}
    assert streamed == (kinds["add"],)
    assert modes[kinds["add"]] == 2 and modes[kinds["sub"]] != 2
    for _ in range(3):  # the same bits every run (the buffers are reused)
        _assert_same_bits(exe.run(*args), _numpy_executable(exe.graph).run(*args))


@needs_native
def test_a_streamed_result_gives_the_same_bits_at_any_offset():
    # Streaming stores start at a 16-byte boundary: the bytes before it, and
    # those after the last whole 16, are copied plainly; every length and
    # split of the elements between threads must give the plain copy's bits.
    def body(b, x, y):
        return b.op("mul", b.op("add", x, y), y)

    for n in (16385, 16389, 40001):  # 64 KiB and more: returned arrays are aligned
        x, y = _special((n,)), _special((n,))
        graph = build([aval((n,), "float32")] * 2, body)
        fused = fuse_elementwise(graph)
        chain_node = next(nd for nd in fused.nodes if nd.primitive.name == "fused_elementwise")
        planned = native_fusion.plan(chain_node.params["chain"], chain_node.params["results"],
                                     [v.aval for v in chain_node.inputs], (), (0,))
        assert _output_modes(planned[0]) == [2]
        code, total, inner, block = planned[:4]
        for lo_blocks in (0, 1, 3):
            out = np.full(n, np.nan, np.float32)
            lo = min(lo_blocks * block, total)
            # An unaligned output (a view one element in) takes the same path.
            shifted = np.empty(n + 1, np.float32)[1:]
            for target in (out, shifted):
                target[:lo] = 0.0
                assert native.elementwise.run(code, total, inner, block, (x, y), (target,), lo, total)
                with np.errstate(invalid="ignore"):  # inf - inf in the specials
                    want = (x + y) * y
                _assert_same_bits([target[lo:]], [want[lo:]])


def _adam_chain():
    """Keras' Adam update of one variable as fusion hands it over: inputs
    g, m, 1 - beta_1, v, 1 - beta_2, alpha, epsilon, w; results m', v', w'."""
    from keras_ipu.device.primitives.registry import REGISTRY

    a, s = aval((1001,)), aval(())  # 1001: not a multiple of any vector width

    def step(name, *refs):
        return (REGISTRY[name], (), refs, a)

    def t(k):
        return ("t", k, a)

    g, m, v, w = (("in", k, a) for k in (0, 1, 3, 7))
    b1, b2, alpha, eps = (("in", k, s) for k in (2, 4, 5, 6))
    chain = (
        step("sub", g, m), step("mul", t(0), b1), step("add", m, t(1)),
        step("square", g), step("sub", t(3), v), step("mul", t(4), b2),
        step("add", v, t(5)), step("mul", t(2), alpha), step("sqrt", t(6)),
        step("add", t(8), eps), step("div", t(7), t(9)), step("sub", w, t(10)),
    )
    return chain, (2, 6, 11), (a, a, s, a, s, s, s, a)


def _adam_operands():
    g, m, w = _special((1001,)), _special((1001,)), _special((1001,))
    v = np.abs(_special((1001,)))
    v[:7] = [-1.0, -0.0, 0.0, np.inf, np.nan, 1e-30, 3.0]  # sqrt's edges
    scalars = [np.asarray(x, np.float32) for x in (0.1, 0.001, 3e-4, 1e-7)]
    return [g, m, scalars[0], v, scalars[1], scalars[2], scalars[3], w]


def _split_chains(monkeypatch, threads):
    """With threads > 1, chains built from now on split over that many
    threads from 100 elements a thread."""
    from keras_ipu.device.native import threads as host_threads

    if threads > 1:
        monkeypatch.setattr(host_threads, "_cap", threads)
        monkeypatch.setattr(host_threads, "NATIVE_ELEMENTS_PER_THREAD", 100)
        monkeypatch.setattr(host_threads, "ELEMENTS_PER_THREAD", 100)


def _captured_chains(monkeypatch):
    """The native kernels fusion builds from now on, each as (the kernel
    rebuilt without a fallback: a chain the C kernel gives back fails, its
    operands' avals, its NumPy kernel)."""
    from keras_ipu.device.compiler import fusion

    captured = []

    def capture(chain, results, in_avals, donate, fallback, *rest):
        kernel = native_fusion.native_kernel(chain, results, in_avals, donate, fallback, *rest)
        captured.append((native_fusion.native_kernel(chain, results, in_avals, donate,
                                                     _no_fallback, *rest),
                         in_avals, fallback))
        return kernel

    monkeypatch.setattr(fusion, "native_kernel", capture)
    return captured


@needs_native
@pytest.mark.parametrize("threads", [1, 4])
def test_adams_update_runs_in_its_own_loop_with_numpys_bits(threads, monkeypatch):
    # The chain Keras' Adam emits has its own loop in the C kernel (one pass
    # computing each element); its results go into the donated m, v and w
    # as the block loop's do, with NumPy's bits, on one thread or split.
    _split_chains(monkeypatch, threads)
    chain, results, in_avals = _adam_chain()
    planned = native_fusion.plan(chain, results, in_avals, donate=(1, 3, 7))
    assert native.elementwise.whole_chain(planned[0]) == "adam"
    assert [into for into, _ in planned[4]] == [1, 3, 7]
    kernel = native_fusion.native_kernel(chain, results, in_avals, (1, 3, 7), _no_fallback)
    assert kernel.whole_chain == "adam"

    xs = _adam_operands()
    g, m, b1, v, b2, alpha, eps, w = [x.copy() for x in xs]
    with np.errstate(all="ignore"):
        new_m = m + (g - m) * b1
        new_v = v + (np.square(g) - v) * b2
        want = [new_m, new_v, w - (new_m * alpha) / (np.sqrt(new_v) + eps)]
    donated = [x.copy() for x in xs]
    got = kernel(*donated)
    assert got[0] is donated[1] and got[1] is donated[3] and got[2] is donated[7]
    _assert_same_bits(list(got), want)

    # The block loop, one pass per operation, on the same program: the same bits.
    was = native.elementwise.whole_chains(False)
    try:
        assert native.elementwise.whole_chain(planned[0]) is None
        blocks = kernel(*[x.copy() for x in xs])
    finally:
        native.elementwise.whole_chains(was)
    _assert_same_bits(list(blocks), want)


@needs_native
def test_a_chain_unlike_adams_in_one_word_keeps_the_block_loop():
    chain, results, in_avals = _adam_chain()
    assert native.elementwise.whole_chain(native_fusion.plan(chain, results, in_avals)[0])
    # epsilon as a full operand instead of a scalar: another program.
    full = list(in_avals)
    full[6] = full[0]
    eps_full = chain[:9] + ((chain[9][0], (), (chain[9][2][0], ("in", 6, full[0])),
                             chain[9][3]),) + chain[10:]
    planned = native_fusion.plan(eps_full, results, tuple(full))
    assert native.elementwise.whole_chain(planned[0]) is None
    # A result order other than (m, v, w): not the adam loop either.
    planned = native_fusion.plan(chain, results[::-1], in_avals)
    assert native.elementwise.whole_chain(planned[0]) is None


def _sgd_momentum_chain():
    """Keras' SGD with momentum as fusion hands it over: inputs m,
    momentum, g, learning rate, w; results m', w'."""
    from keras_ipu.device.primitives.registry import REGISTRY

    a, s = aval((1001,)), aval(())
    m, g, w = (("in", k, a) for k in (0, 2, 4))
    momentum, lr = ("in", 1, s), ("in", 3, s)
    chain = (
        (REGISTRY["mul"], (), (m, momentum), a),
        (REGISTRY["mul"], (), (g, lr), a),
        (REGISTRY["sub"], (), (("t", 0, a), ("t", 1, a)), a),
        (REGISTRY["add"], (), (w, ("t", 2, a)), a),
    )
    return chain, (2, 3), (a, s, a, s, a)


@needs_native
def test_sgd_momentums_update_runs_in_its_own_loop_with_numpys_bits():
    chain, results, in_avals = _sgd_momentum_chain()
    kernel = native_fusion.native_kernel(chain, results, in_avals, (0, 2, 4), _no_fallback)
    assert kernel.whole_chain == "sgd_momentum"
    m, g, w = _special((1001,)), _special((1001,)), _special((1001,))
    momentum, lr = np.asarray(0.9, np.float32), np.asarray(0.01, np.float32)
    with np.errstate(all="ignore"):
        new_m = m * momentum - g * lr
        want = [new_m, w + new_m]
    donated = [m.copy(), momentum, g.copy(), lr, w.copy()]
    got = kernel(*donated)
    assert got[0] is donated[0] and got[1] is donated[4]
    _assert_same_bits(list(got), want)


@needs_native
@pytest.mark.numpy_engine
@pytest.mark.parametrize("optimizer, name", [
    ("Adam()", "adam"), ("AdamW(weight_decay=0.01)", "adamw"),
    ("SGD(0.01, momentum=0.9)", "sgd_momentum"),
])
def test_keras_optimizers_take_their_own_loops_with_numpys_bits(optimizer, name, monkeypatch):
    import keras

    from keras_ipu.device.compiler import fusion

    # The chains Keras' optimizers emit, as fusion hands them over, are what
    # the C kernel matches: if an optimizer or fusion changes them, this
    # fails rather than every update silently running in the block loop.
    # Each captured kernel then runs on NaN, infinities and -0.0 against
    # its NumPy kernel.
    captured = _captured_chains(monkeypatch)
    model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(8)])
    model.compile(optimizer=eval(f"keras.optimizers.{optimizer}"), loss="mse")
    x = np.ones((4, 16), np.float32)
    model.fit(x, np.zeros((4, 8), np.float32), batch_size=4, epochs=1, verbose=0)
    ours = [(k, avals, numpy_kernel) for k, avals, numpy_kernel in captured
            if getattr(k, "whole_chain", None) == name]
    assert len(ours) >= 2  # the kernel and the bias
    for kernel, in_avals, numpy_kernel in ours:
        xs = [np.asarray(_rng.uniform(1e-4, 0.2), np.float32) if a.shape == ()
              else _special(a.shape) for a in in_avals]
        got = kernel(*[x.copy() for x in xs])
        with np.errstate(all="ignore"):
            want = numpy_kernel(*[x.copy() for x in xs])
        _assert_same_bits(list(got), list(want))


@needs_native
@pytest.mark.numpy_engine
@pytest.mark.parametrize("threads", [1, 4])
def test_a_dense_layers_bias_and_relu_run_in_their_own_loop_with_numpys_bits(
        threads, monkeypatch):
    import keras

    # Dense(activation="relu") traces to bias + max(., 0) with the
    # derivative JAX's max rule keeps for the backward pass: the C kernel
    # matches that chain (it fails here if Keras or fusion changes it) and
    # runs it in one loop, its bias indexed by the element's column, on
    # one thread and split over the pool (300 rows of 29: ranges of 141 rows).
    _split_chains(monkeypatch, threads)
    captured = _captured_chains(monkeypatch)
    # An input width of its own per case: a program compiled before is
    # reused without passing through fusion again.
    model = keras.Sequential([keras.Input((16 + threads,)),
                              keras.layers.Dense(29, activation="relu"), keras.layers.Dense(3)])
    model.compile(optimizer="sgd", loss="mse")
    x = np.ones((300, 16 + threads), np.float32)
    model.fit(x, np.zeros((300, 3), np.float32), batch_size=300, epochs=1, verbose=0)
    ours = [(k, avals, numpy_kernel) for k, avals, numpy_kernel in captured
            if getattr(k, "whole_chain", None) == "bias_relu"]
    assert ours
    for kernel, in_avals, numpy_kernel in ours:
        xs = [np.asarray(0.0, np.float32) if a.shape == () else _special(a.shape)
              for a in in_avals]
        xs[0][0, :6] = [0.0, -0.0, np.nan, np.inf, -np.inf, 1e-45]  # x + b's edges
        xs[1][:6] = 0.0
        # The scalars as the derivative's constants would be (1, 0.5, 0),
        # and a floor and comparisons at zero.
        for k, value in zip(range(2, 8), (0.0, 0.0, 0.0, 0.5, 0.0, 1.0)):
            xs[k] = np.asarray(value, np.float32)
        with np.errstate(all="ignore"):
            want = numpy_kernel(*[x.copy() for x in xs])
            got = kernel(*[x.copy() for x in xs])
            _assert_same_bits(list(got), list(want))
            was = native.elementwise.whole_chains(False)
            try:
                blocks = kernel(*[x.copy() for x in xs])
            finally:
                native.elementwise.whole_chains(was)
        _assert_same_bits(list(blocks), list(want))


def _softmax_chains(rows, cols, unary="exp"):
    """Softmax's chains as fusion hands them over (m, s, a, b columns):
    exp(x - m) (or another unary op after the subtraction); JAX's division
    rule on e / s, inputs e, s, results e / s and -((e / s) / s); its
    backward, inputs g, a, b, e, result (g a + b) e."""
    from keras_ipu.device.primitives.registry import REGISTRY

    full, column = aval((rows, cols)), aval((rows, 1))

    def step(name, *refs):
        return (REGISTRY[name], (), refs, full)

    x, m = ("in", 0, full), ("in", 1, column)
    exponentials = (step("sub", x, m), step(unary, ("t", 0, full)))
    e, s = ("in", 0, full), ("in", 1, column)
    forward = (step("div", e, s), step("div", ("t", 0, full), s), step("neg", ("t", 1, full)))
    g, a, b, e3 = ("in", 0, full), ("in", 1, column), ("in", 2, column), ("in", 3, full)
    backward = (step("mul", g, a), step("add", ("t", 0, full), b),
                step("mul", ("t", 1, full), e3))
    return ((exponentials, (1,), (full, column)), (forward, (0, 2), (full, column)),
            (backward, (2,), (full, column, column, full)))


@needs_native
@pytest.mark.parametrize("threads", [1, 4])
def test_softmax_chains_run_in_their_own_loops_with_numpys_bits(threads, monkeypatch):
    # Rows of 29 (not a multiple of any vector width), 300 of them (8700
    # elements: two spans of the exponentials' buffer and part of a third);
    # with four threads the chains run as ranges of whole blocks of rows.
    # The exponentials' kernel calls whichever NumPy loop the program
    # names (tanh: the same kernel).
    _split_chains(monkeypatch, threads)
    chains = _softmax_chains(300, 29) + _softmax_chains(300, 29, "tanh")[:1]
    x, m = _special((300, 29)), _special((300, 1))
    e, s = _special((300, 29)), _special((300, 1))
    g, a, b = _special((300, 29)), _special((300, 1)), _special((300, 1))
    with np.errstate(all="ignore"):
        z = e / s
        wants = ([np.exp(x - m)], [z, -(z / s)], [(g * a + b) * e], [np.tanh(x - m)])
    operands = ((x, m), (e, s), (g, a, b, e), (x, m))
    names = ("softmax_exp", "softmax_forward", "softmax_backward", "softmax_exp")
    for (chain, results, in_avals), xs, want, name in zip(chains, operands, wants, names):
        kernel = native_fusion.native_kernel(chain, results, in_avals, (), _no_fallback)
        assert kernel.whole_chain == name
        with np.errstate(all="ignore"):
            _assert_same_bits(list(kernel(*[x.copy() for x in xs])), want)
            was = native.elementwise.whole_chains(False)
            try:
                _assert_same_bits(list(kernel(*[x.copy() for x in xs])), want)
            finally:
                native.elementwise.whole_chains(was)


@needs_native
def test_softmax_chains_of_zero_rows_write_nothing():
    # The programs of 5 rows run on none: nothing to compute, and the
    # call says it ran.
    from keras_ipu.device.compiler.numpy_loops import float32_loop

    for chain, results, in_avals in _softmax_chains(5, 29):
        code, _, inner, block, _, _, ufuncs = native_fusion.plan(chain, results, in_avals)
        assert native.elementwise.whole_chain(code) is not None
        ins = tuple(np.empty((0, a.shape[1]), np.float32) for a in in_avals)
        outs = tuple(np.empty((0, 29), np.float32) for _ in results)
        loops = tuple(float32_loop(u) for u in ufuncs)
        assert native.elementwise.run(code, 0, inner, block, ins, outs, 0, -1, loops) is True


@needs_native
@pytest.mark.numpy_engine
@pytest.mark.parametrize("threads", [1, 4])
def test_a_transformer_blocks_chains_take_their_own_loops_with_numpys_bits(
        threads, monkeypatch):
    import keras

    # fit_throughput's transformer block, small: attention's softmax and the
    # two LayerNormalizations trace to the chains the C kernel matches
    # (this fails if Keras or fusion changes them). Each captured kernel
    # runs on NaN, infinities and -0.0 against its NumPy kernel and in the
    # block loop, on one thread and split (ranges of whole rows), and its
    # program on zero rows.
    ours = {"softmax_exp", "softmax_forward", "softmax_backward", "layer_norm",
            "layer_norm_backward"}
    _split_chains(monkeypatch, threads)
    captured = _captured_chains(monkeypatch)
    layers = keras.layers
    tokens = keras.Input((8,), dtype="int32")
    x = layers.Embedding(50, 16 + threads)(tokens)  # a width per case: no reused program
    x = layers.LayerNormalization()(x + layers.MultiHeadAttention(2, 8)(x, x))
    ff = layers.Dense(16 + threads)(layers.Dense(32, activation="relu")(x))
    x = layers.LayerNormalization()(x + ff)
    model = keras.Model(tokens, layers.Dense(5)(layers.GlobalAveragePooling1D()(x)))
    model.compile(optimizer="sgd",
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    ids = _rng.integers(0, 50, (12, 8)).astype(np.int32)
    model.fit(ids, np.zeros((12,), np.int32), batch_size=12, epochs=1, verbose=0)
    mine = [(k, avals, f) for k, avals, f in captured if getattr(k, "whole_chain", None) in ours]
    assert {k.whole_chain for k, _, _ in mine} == ours
    for kernel, in_avals, numpy_kernel in mine:
        xs = [_special(a.shape) for a in in_avals]
        with np.errstate(all="ignore"):
            want = numpy_kernel(*[x.copy() for x in xs])
            _assert_same_bits(list(kernel(*[x.copy() for x in xs])), list(want))
            was = native.elementwise.whole_chains(False)
            try:
                _assert_same_bits(list(kernel(*[x.copy() for x in xs])), list(want))
            finally:
                native.elementwise.whole_chains(was)
        code, n, inner, block, loops = kernel.one_thread_call[:5]
        # Full and column operands of no rows; a row operand (1, 1, L) as it is.
        ins = tuple(np.empty((0,) + a.shape[1:], np.float32) if a.shape[0] > 1
                    else np.empty(a.shape, np.float32) for a in in_avals)
        full = max(in_avals, key=lambda a: np.prod(a.shape)).shape
        outs = tuple(np.empty((0,) + full[1:], np.float32) for _ in range(len(want)))
        assert native.elementwise.run(code, 0, inner, block, ins, outs, 0, -1, loops) is True
