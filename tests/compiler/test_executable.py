import pickle

import numpy as np
import pytest
from compiler_graphs import aval
from compiler_graphs import build
from compiler_graphs import lit

from keras_ipu.device.compiler import CompileOptions
from keras_ipu.device.compiler import Executable
from keras_ipu.device.compiler import compile_graph


def _graph():
    def body(b, x, w):
        y = b.op(
            "dot_general", x, w,
            dimension_numbers=(((1,), (0,)), ((), ())), preferred_element_type=None,
        )
        y = b.op("add", y, lit(np.array([1.0, 2.0], np.float32)))
        y = b.op("max", y, lit(0.0, "float32"))
        return [y, b.op("reduce_sum", y, axes=(0, 1)), x]

    return build([aval((3, 4)), aval((4, 2))], body)


def _expected(x, w):
    y = np.maximum(x @ w + np.array([1.0, 2.0], np.float32), 0)
    return [y, y.sum(), x]


def test_run_matches_numpy_and_returns_ndarrays():
    exe = compile_graph(_graph())
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 4)).astype(np.float32)
    w = rng.standard_normal((4, 2)).astype(np.float32)
    outs = exe.run(x, w)
    assert all(type(o) is np.ndarray for o in outs)
    assert outs[1].shape == () and outs[1].dtype == np.float32
    for got, want in zip(outs, _expected(x, w)):
        np.testing.assert_allclose(got, want, rtol=1e-5)
    # Running twice gives the same answer (no state left behind).
    for got, want in zip(exe.run(x, w), outs):
        np.testing.assert_array_equal(got, want)


def test_program_is_flat_and_frees_values_at_their_last_use():
    exe = compile_graph(_graph())
    kinds = [n.primitive.name for n in exe.steps]
    assert kinds == ["dot_general", "fused_elementwise", "reduce_sum"]
    frees = [fr for _, _, _, _, fr in exe._program]
    assert 1 in frees[0]  # w (slot 1) dies at the dot
    assert 0 not in sum(frees, ())  # x is an output: never freed
    for kernel, ins, out, multi, fr in exe._program:
        assert callable(kernel) and isinstance(ins, tuple)


def test_str_prints_the_program_readably():
    text = str(compile_graph(_graph()))
    assert text.startswith("Executable: 2 inputs, 3 outputs, 3 steps")
    assert "in0:f32[3,4] in1:f32[4,2]" in text
    assert "= dot_general[" in text and "fused_elementwise" in text
    assert "_maximum(" in text  # the fused kernel's generated code
    assert "outputs: " in text


def test_unoptimized_compile_gives_the_same_values():
    x = np.ones((3, 4), np.float32)
    w = np.full((4, 2), -0.25, np.float32)
    off = CompileOptions(
        fold_constants=False, eliminate_common_subexpressions=False,
        eliminate_dead_code=False, fuse_elementwise=False,
    )
    a = compile_graph(_graph(), off)
    b = compile_graph(_graph())
    assert len(a.steps) == 4 and len(b.steps) == 3
    for got, want in zip(a.run(x, w), b.run(x, w)):
        np.testing.assert_array_equal(got, want)


def test_pickle_round_trip_rebinds_kernels():
    exe = compile_graph(_graph())
    again = pickle.loads(pickle.dumps(exe))
    x = np.arange(12, dtype=np.float32).reshape(3, 4) / 10
    w = np.ones((4, 2), np.float32)
    for got, want in zip(again.run(x, w), exe.run(x, w)):
        np.testing.assert_array_equal(got, want)
    assert str(again) == str(exe)


def test_input_errors_name_the_input_and_the_fix():
    exe = compile_graph(_graph())
    with pytest.raises(ValueError, match=r"Input 1 has shape \(4, 3\).*f32\[4,2\]"):
        exe.run(np.ones((3, 4), np.float32), np.ones((4, 3), np.float32))
    with pytest.raises(TypeError, match="takes 2 inputs"):
        exe.run(np.ones((3, 4), np.float32))
    with pytest.raises(TypeError, match="Input 0 has dtype complex64"):
        exe.run(np.ones((3, 4), np.complex64), np.ones((4, 2), np.float32))


def test_literal_and_input_outputs():
    g = build([aval((2,))], lambda b, x: [x, lit(np.array([7], np.int32))])
    exe = Executable(g)
    x = np.array([1.0, 2.0], np.float32)
    got_x, got_c = exe.run(x)
    np.testing.assert_array_equal(got_x, x)
    np.testing.assert_array_equal(got_c, [7])


def test_peak_live_bytes_is_exposed():
    exe = compile_graph(_graph())
    # At the dot: x (48 B), w (32 B) and its result (24 B); w dies there,
    # so the fused step after it only reaches 48 + 24 + 24.
    assert exe.peak_live_bytes == 48 + 32 + 24


def test_constants_are_private_and_read_only():
    weights = np.array([1.0, 2.0], np.float32)
    g = build([aval((2,))], lambda b, x: [b.op("mul", x, lit(weights)), lit(weights)])
    exe = Executable(g)
    weights[:] = 100.0  # the caller's array changes after compiling
    out, const = exe.run(np.ones(2, np.float32))
    np.testing.assert_array_equal(out, [1.0, 2.0])
    const[:] = -1.0  # a returned constant is the caller's copy
    np.testing.assert_array_equal(exe.run(np.ones(2, np.float32))[1], [1.0, 2.0])
    assert all(not c.flags.writeable for c in exe.constants.values())
