"""exp, log, tanh, the logistic function and the other float32 ufunc
primitives inside the C fused chains (native_fusion.py, numpy_loops.py):
_elementwise.c calls NumPy's own loop block by block, so the results must
be NumPy's bits on every value (NaN payloads, infinities, denormals, -0.0),
at every position in a block and every chain length, and in the chains the
models make (softmax, an LSTM cell)."""

import numpy as np
import pytest
from compiler_graphs import aval
from compiler_graphs import build
from compiler_graphs import lit
from test_native_fusion import _agrees
from test_native_fusion import _special
from test_native_fusion import _uses_native
from test_native_fusion import needs_native

from keras_ipu.device import native
from keras_ipu.device.compiler import native_fusion
from keras_ipu.device.compiler.numpy_loops import float32_loop
from keras_ipu.device.primitives.registry import REGISTRY

_rng = np.random.default_rng(5)
UNARY = ["exp", "log", "tanh", "logistic", "expm1", "log1p", "sin", "cos", "rsqrt"]


def _all_kinds(n):
    """Random bit patterns (every exponent, NaNs with payloads, denormals),
    the special values, and values where exp/tanh/logistic saturate."""
    bits = _rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32)
    x = bits.view(np.float32)
    specials = np.array(
        [np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-45, -1e-45, 1.1754942e-38,
         -1.1754942e-38, 88.72283, 88.72284, -103.97208, -87.33655, 9.0, -9.0, 1.0, -1.0,
         np.finfo(np.float32).max, -np.finfo(np.float32).max], np.float32)
    x[: specials.size] = specials
    x[specials.size: 3 * n // 4] = _rng.standard_normal(3 * n // 4 - specials.size) * 6
    return _rng.permutation(x)


@needs_native
@pytest.mark.parametrize("op", UNARY)
def test_transcendentals_give_numpys_bits(op):
    def body(b, x):
        return b.op("mul", b.op(op, x), lit(1.0, "float32"))

    x = _all_kinds(50_000)
    assert _uses_native(_agrees(body, x))


@needs_native
@pytest.mark.parametrize("n", [1, 2, 3, 7, 8, 15, 16, 17, 31, 33, 63, 65, 255, 4095, 4097, 9001])
def test_every_length_and_position_in_a_block(n):
    # The C kernel calls NumPy's loop on blocks of its own, NumPy on the
    # whole array: an element's result must not depend on where it sits
    # (a SIMD loop's tail is handled apart).
    def body(b, x):
        s = b.op("mul", x, lit(1.0, "float32"))  # one chain: all read s
        return [b.op("exp", s), b.op("tanh", s), b.op("logistic", s)]

    x = _all_kinds(max(n, 64))[:n]
    assert _uses_native(_agrees(body, x))


@needs_native
def test_softmax_and_an_lstm_cell_run_in_one_c_chain():
    # The transformer's softmax numerator (x - max, a column, then exp) and
    # an LSTM cell's gates: before, both stayed in NumPy.
    def softmax(b, x, m):
        return b.op("exp", b.op("sub", x, m))

    x = _special((8, 4, 16, 16)) * np.float32(4)
    exe = _agrees(softmax, x, np.max(x, axis=-1, keepdims=True))
    assert _uses_native(exe) and len(exe._kernels) == 1

    def cell(b, i, f, g, o, c):
        c2 = b.op("add", b.op("mul", b.op("logistic", f), c),
                  b.op("mul", b.op("logistic", i), b.op("tanh", g)))
        return [c2, b.op("mul", b.op("logistic", o), b.op("tanh", c2))]

    # Finite gates: where two NaNs of different signs meet in an add, the
    # C chain and NumPy may keep different ones (an older limit of the
    # C kernel's add, not of these loops; the unary tests cover NaN).
    gates = [_rng.standard_normal((64, 48)).astype(np.float32) * 3 for _ in range(5)]
    exe = _agrees(cell, *gates)
    assert all(getattr(k, "native", False) for k in exe._kernels), str(exe)


@needs_native
def test_large_transcendental_chains_split_over_threads(monkeypatch):
    from keras_ipu.device.native import threads

    monkeypatch.setattr(threads, "_cap", 4)
    monkeypatch.setattr(threads, "ELEMENTS_PER_THREAD", 1000)

    def body(b, x, m):
        return b.op("exp", b.op("sub", x, m))

    x = _special((40, 31, 24))
    assert _uses_native(_agrees(body, x, np.max(x, axis=-1, keepdims=True)))


def test_plan_names_the_loops_it_calls():
    f32 = aval((100,))
    chain = ((REGISTRY["tanh"], (), (("in", 0, f32),), f32),
             (REGISTRY["logistic"], (), (("t", 0, f32),), f32),
             (REGISTRY["exp"], (), (("t", 1, f32),), f32))
    planned = native_fusion.plan(chain, (2,), (f32,))
    if native.elementwise is None or float32_loop(np.exp) is None:
        assert planned is None or planned[-1] == ()
        return
    assert planned[-1] == (np.tanh, np.exp)  # logistic runs on exp's loop


@needs_native
def test_run_refuses_capsules_that_are_not_numpy_loops():
    f32 = aval((10,))
    chain = ((REGISTRY["exp"], (), (("in", 0, f32),), f32),)
    code, n, inner, block, *_ = native_fusion.plan(chain, (0,), (f32,))
    x, out = np.ones(10, np.float32), np.empty(10, np.float32)
    with pytest.raises(ValueError, match="loop"):
        native.elementwise.run(code, n, inner, block, (x,), (out,), 0, -1, ())
    with pytest.raises(ValueError, match="not a usable NumPy loop"):
        native.elementwise.run(code, n, inner, block, (x,), (out,), 0, -1, (object(),))
    assert not native.elementwise.loop_usable(object())


@needs_native
@pytest.mark.parametrize("op", ["exp", "tanh", "logistic", "log"])
def test_strided_operands_are_copied_and_keep_numpys_bits(op):
    # An LSTM cell reads its gates as column slices of one product (views):
    # the chain copies them and runs in C, with the bits NumPy's kernel
    # gives on the views themselves.
    from keras_ipu.device.compiler.fusion import build_fused_kernel

    f32 = aval((64, 32))
    chain = ((REGISTRY[op], (), (("in", 0, f32),), f32),
             (REGISTRY["mul"], (), (("t", 0, f32), ("in", 1, f32)), f32))
    numpy_kernel = build_fused_kernel(chain, (1,), 2)
    kernel = native_fusion.native_kernel(chain, (1,), (f32, f32), (), _refuse)
    whole = _all_kinds(64 * 128).reshape(64, 128)
    finite = _rng.standard_normal((64, 64)).astype(np.float32)  # see the cell test
    views = (whole[:, 32:64], finite[:, ::2])
    assert not views[0].flags.c_contiguous
    with np.errstate(all="ignore"):
        want = numpy_kernel(*views)
    got = kernel(*views)
    np.testing.assert_array_equal(got[0].view(np.uint32), want[0].view(np.uint32))


@needs_native
@pytest.mark.parametrize("shape,width", [((64, 32), 128), ((300, 37), 100), ((5, 4099), 12288)])
def test_operands_with_rows_apart_are_read_in_place(monkeypatch, shape, width):
    # Column slices of one wider array (an LSTM cell's gates): the C kernel
    # gathers each block's rows itself, blocks crossing rows, no copy first.
    from keras_ipu.device.compiler.fusion import build_fused_kernel

    f32 = aval(shape)
    chain = ((REGISTRY["tanh"], (), (("in", 0, f32),), f32),
             (REGISTRY["mul"], (), (("t", 0, f32), ("in", 1, f32)), f32),
             (REGISTRY["logistic"], (), (("t", 1, f32),), f32))
    numpy_kernel = build_fused_kernel(chain, (0, 2), 2)
    monkeypatch.setattr(native_fusion, "_contiguous", _refuse)
    kernel = native_fusion.native_kernel(chain, (0, 2), (f32, f32), (), _refuse)
    rows, cols = shape
    whole = _all_kinds(rows * width).reshape(rows, width)
    whole[:, width - cols:] = _rng.standard_normal((rows, cols)) * 4  # see the cell test
    views = (whole[:, 1:1 + cols], whole[:, width - cols:])
    assert not views[0].flags.c_contiguous
    with np.errstate(all="ignore"):
        want = numpy_kernel(*views)
    got = kernel(*views)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g.view(np.uint32), w.view(np.uint32))


def _refuse(*xs):
    pytest.fail("fell back to NumPy")


_refuse.source = ""


@needs_native
@pytest.mark.parametrize("shape,width", [((64, 32), 128), ((300, 37), 100), ((5, 4099), 12288)])
def test_results_with_rows_apart_are_written_in_place(shape, width):
    # Column blocks of one wider array (the LSTM's backward gate gradients
    # written into their concatenate's slot: stack_slots.py): each block's
    # results scattered to their rows, the columns around them untouched.
    from keras_ipu.device.compiler.fusion import build_fused_kernel

    f32 = aval(shape)
    chain = ((REGISTRY["tanh"], (), (("in", 0, f32),), f32),
             (REGISTRY["mul"], (), (("t", 0, f32), ("in", 1, f32)), f32),
             (REGISTRY["logistic"], (), (("t", 1, f32),), f32))
    numpy_kernel = build_fused_kernel(chain, (0, 2), 2)
    kernel = native_fusion.native_kernel(chain, (0, 2), (f32, f32), (), _refuse)
    assert kernel.placeable == {0, 1}
    rows, cols = shape
    xs = (_all_kinds(rows * cols).reshape(rows, cols),
          (_rng.standard_normal(shape) * 4).astype(np.float32))
    with np.errstate(all="ignore"):
        want = numpy_kernel(*xs)
    dest = np.full((rows, width), -7.0, np.float32)
    views = (dest[:, 1:1 + cols], dest[:, width - cols:])
    got = kernel.placed((0, 1))(*xs, *views)
    assert got[0] is views[0] and got[1] is views[1]
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g.view(np.uint32), w.view(np.uint32))
    untouched = np.ones(width, bool)
    untouched[1:1 + cols] = untouched[width - cols:] = False
    assert (dest[:, untouched] == -7.0).all()
