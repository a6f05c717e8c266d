"""The TensorFlow engines: programs emitted to TensorFlow (device/to_tensorflow)
and compiled by XLA (`xla`) or run by TensorFlow's graph runtime
(`tensorflow`, the emitter's graph mode) give the NumPy engine's values;
the engine choice (compiler/engines.py): KERAS_IPU_ENGINE, the tiered
default (compiler/tiered_runner.py), the fallbacks, TensorFlow's pools and
the exit during a background compile (compiler/tensorflow_runtime.py).
"""

import os
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest
from compiler_graphs import aval
from compiler_graphs import build
from compiler_graphs import lit

from keras_ipu.device.compiler import compile_graph
from keras_ipu.device.compiler import engine_choice
from keras_ipu.device.compiler import engines
from keras_ipu.device.compiler import tensorflow_runtime
from keras_ipu.device.compiler import tiered_runner
from keras_ipu.device.simulator.system import FPBehaviour

pytest.importorskip("tensorflow")

from keras_ipu.device.to_tensorflow.onednn import onednn_enabled  # noqa: E402

RNG = np.random.default_rng(7)
# A fit in a subprocess: a guard against a hang, not a speed limit (one took
# 300 s beside five engineers' benchmarks at load 9-11).
HANG_LIMIT_S = 900


class Target:
    """The TensorFlow engine a rule test runs on, and the test's monkeypatch."""

    def __init__(self, engine, monkeypatch):
        self.engine = engine
        self.monkeypatch = monkeypatch

    def use(self):
        self.monkeypatch.setenv(engine_choice.ENV, self.engine)
        self.monkeypatch.setenv(engines.STRICT_ENV, "1")


@pytest.fixture(params=["xla", "tensorflow"])
def target(request, monkeypatch):
    return Target(request.param, monkeypatch)


def run_both(graph, inputs, target):
    """(NumPy results, the target engine's results) of the compiled graph."""
    target.monkeypatch.setenv(engine_choice.ENV, "numpy")
    want = compile_graph(graph).run(*[np.array(x) for x in inputs])
    target.use()
    exe = compile_graph(graph)
    got = exe.run(*[np.array(x) for x in inputs])
    assert engine_choice.current_engine(exe) == target.engine
    return want, got


def check(graph, inputs, target, rtol=1e-5, atol=1e-6, exact=False):
    want, got = run_both(graph, inputs, target)
    assert len(want) == len(got)
    for w, g in zip(want, got):
        assert type(g) is np.ndarray  # 0-d results too, as on NumPy
        assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, g.dtype, w.shape, w.dtype)
        if exact or w.dtype.kind not in "fc":
            np.testing.assert_array_equal(g, w)
        else:
            np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)


def f32(*shape, low=-2.0, high=2.0):
    return RNG.uniform(low, high, shape).astype(np.float32)


def one(name, avals, **params):
    return build([aval(s, d) for s, d in avals], lambda b, *xs: b.op(name, *xs, **params))


UNARY = {
    "neg": None, "abs": None, "floor": None, "ceil": None, "round": None,
    "trunc": None, "sign": None, "exp": None, "expm1": None, "tanh": None,
    "logistic": None, "sin": None, "cos": None, "square": None, "erf": None,
    "atan": None, "sinh": None, "exp2": None, "cbrt": None, "i0": None, "i1": None,
    "i0e": None, "i1e": None, "lgamma": (0.1, 3.0), "digamma": (0.1, 3.0),
    "log": (0.1, 3.0), "log1p": (0.1, 3.0), "log2": (0.1, 3.0), "log10": (0.1, 3.0),
    "sqrt": (0.1, 3.0), "rsqrt": (0.1, 3.0), "reciprocal": (0.1, 3.0),
}


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_float_rules(name, target):
    low, high = UNARY[name] or (-2.0, 2.0)
    x = f32(5, 7, low=low, high=high)
    check(one(name, [((5, 7), "float32")]), [x], target, rtol=2e-5, atol=1e-6)


BINARY = ["add", "sub", "mul", "div", "max", "min", "atan2", "rem", "mod",
          "floor_div", "hypot", "logaddexp", "copysign", "nextafter"]


@pytest.mark.parametrize("name", BINARY)
def test_binary_float_rules_broadcast(name, target):
    x, y = f32(4, 6), f32(6)
    check(one(name, [((4, 6), "float32"), ((6,), "float32")]), [x, y], target,
          rtol=2e-5)


@pytest.mark.parametrize("name", ["eq", "ne", "lt", "le", "gt", "ge"])
def test_comparisons(name, target):
    x = np.array([1.0, np.nan, 2.0, -0.0, np.inf], np.float32)
    y = np.array([1.0, 1.0, 3.0, 0.0, np.inf], np.float32)
    check(one(name, [((5,), "float32"), ((5,), "float32")]), [x, y], target)


@pytest.mark.parametrize("name", ["add", "sub", "mul", "div", "max", "min", "rem",
                                  "mod", "floor_div", "and", "or", "xor"])
def test_integer_rules(name, target):
    x = np.array([7, -7, 9, -9, 0, 100], np.int32)
    y = np.array([2, 2, -4, -4, 3, 7], np.int32)
    check(one(name, [((6,), "int32"), ((6,), "int32")]), [x, y], target)


@pytest.mark.parametrize("name", ["add", "mul", "sub", "and", "or", "xor", "max"])
def test_bool_rules(name, target):
    x = np.array([True, True, False, False])
    y = np.array([True, False, True, False])
    check(one(name, [((4,), "bool"), ((4,), "bool")]), [x, y], target)


@pytest.mark.parametrize("name", ["shift_left", "shift_right"])
def test_shifts_by_the_width_or_more(name, target):
    x = np.array([1, -8, 255, -1, 3], np.int32)
    y = np.array([1, 2, 31, 32, -1], np.int32)
    check(one(name, [((5,), "int32"), ((5,), "int32")]), [x, y], target)


@pytest.mark.parametrize("dtype", ["int32", "uint8", "bool", "float16"])
def test_convert_float_truncates_saturates_and_zeroes_nan(dtype, target):
    x = np.array([1.7, -1.7, np.nan, np.inf, -np.inf, 3e9, -3e9, 300.0, 0.0], np.float32)
    check(one("convert_element_type", [((9,), "float32")], dtype=np.dtype(dtype)),
          [x], target)


def test_select_clamp_and_bitcast(target):
    def body(b, p, x, y):
        s = b.op("select", p, x, y)
        c = b.op("clamp", lit(np.float32(-0.5)), s, lit(np.float32(0.5)))
        bits = b.op("bitcast_convert_type", c, dtype=np.dtype("int32"))
        return [s, c, bits, b.op("signbit", x), b.op("isnan", y)]

    graph = build([aval((3, 4), "bool"), aval((3, 4)), aval((4,))], body)
    check(graph, [RNG.random((3, 4)) > 0.5, f32(3, 4), f32(4)], target, exact=True)


@pytest.mark.parametrize("name", ["reduce_sum", "reduce_max", "reduce_min", "reduce_prod"])
@pytest.mark.parametrize("axes", [(0,), (1, 2), (0, 1, 2), ()])
def test_reductions(name, axes, target):
    check(one(name, [((3, 4, 5), "float32")], axes=axes), [f32(3, 4, 5)], target, rtol=1e-5)


@pytest.mark.parametrize("shape,axes", [((64, 8, 8, 32), (0, 1, 2)), ((2, 4096, 9), (1, 0)),
                                        ((300, 7, 40), (0,)), ((8192, 64), (1,)),
                                        ((128, 4, 64, 64), (3,)), ((40, 30, 50), (2, 1)),
                                        ((0, 40000), (0,)), ((40000, 0), (1,))])
def test_large_sums_over_leading_axes(shape, axes, target):
    # The graph mode's MatMul by a row of ones, and the XLA mode's product
    # with a vector of ones over leading or trailing axes: the same sums,
    # added in another order (within float32 rounding of a 64K-term sum).
    check(one("reduce_sum", [(shape, "float32")], axes=axes), [f32(*shape)], target,
          rtol=1e-4, atol=2e-3)


def _negated_sums(b, x):
    # -sum(v) as the autodiff writes it (a batch normalization's mean
    # gradient): over leading axes (the product by ones), over all, and a
    # negation also read elsewhere.
    lone, kept = b.op("neg", x), b.op("neg", b.op("mul", x, x))
    return [b.op("reduce_sum", lone, axes=(0, 1, 2)), b.op("reduce_sum", b.op("neg", x), axes=(0, 1, 2, 3)),
            b.op("reduce_sum", kept, axes=(0, 1, 2)), b.op("add", kept, x)]


def test_negated_sums_keep_values(target):
    graph = build([aval((64, 8, 8, 32))], _negated_sums)
    check(graph, [f32(64, 8, 8, 32)], target, rtol=1e-4, atol=2e-3)


def test_graph_mode_negates_a_sum_not_its_operand():
    import tensorflow as tf

    from keras_ipu.device.to_tensorflow import emit_graph

    graph = build([aval((64, 8, 8, 32))], _negated_sums)
    x = tf.constant(f32(64, 8, 8, 32))
    ops = _graph_mode_ops(graph, [((64, 8, 8, 32), "float32")])
    # (A negation nothing reads is pruned by TensorFlow.)
    negs = [op for op in ops.get_operations() if op.type == "Neg" and op.outputs[0].consumers()]
    # The lone negations are of the sums (32 and one element); the one read
    # twice stays over the array.
    assert sorted(op.outputs[0].shape.num_elements() for op in negs) == [1, 32, 64 * 8 * 8 * 32]
    # The negated sum is the plain emission's bits.
    lone = emit_graph(graph, [x], mode="graph")[0]
    plain = tf.reshape(tf.linalg.matmul(tf.ones((1, 4096)), tf.reshape(-x, (4096, 32))), (32,))
    np.testing.assert_array_equal(lone.numpy(), plain.numpy())


def test_xla_mode_sums_leading_or_trailing_axes_as_a_product_only():
    # XLA's CPU compiler splits a sum of a product into a reduce-window of
    # 32 and a reduce, a slow loop; the product with ones is not split.
    import tensorflow as tf

    from keras_ipu.device.to_tensorflow import emit_graph

    def ops(shape, axes, dtype="float32"):
        graph = one("reduce_sum", [(shape, dtype)], axes=axes)
        fn = tf.function(lambda x: emit_graph(graph, [x], mode="xla"), autograph=False)
        concrete = fn.get_concrete_function(tf.TensorSpec(shape, dtype))
        return {op.type for op in concrete.graph.get_operations()}

    for shape, axes, dtype in [((128, 64, 128), (0, 1), "float32"),  # bias gradient
                               ((128, 64, 64), (2,), "float32"),  # row sums
                               ((64, 8, 8, 32), (3, 2, 1), "float64")]:
        assert "XlaDotV2" in ops(shape, axes, dtype) and "Sum" not in ops(shape, axes, dtype)
    for shape, axes, dtype in [((64, 8, 8, 32), (1, 2), "float32"),  # middle axes
                               ((64, 8, 8, 32), (0, 1, 2, 3), "float32"),  # all axes
                               ((128, 128), (0,), "float32"),  # small
                               ((0, 40000), (0,), "float32"),  # empty
                               ((64, 8, 8, 32), (0, 1, 2), "int32"),
                               ((64, 8, 8, 32), (0, 1, 2), "float16")]:
        assert "XlaDotV2" not in ops(shape, axes, dtype) and "Sum" in ops(shape, axes, dtype)


@pytest.mark.parametrize("shape, axes, dtype, trailing, want", [
    ((64, 8, 8, 32), (2, 0, 1), "float32", False, (4096, 32, 0)),
    ((128, 64, 64), (2,), "float32", True, (8192, 64, 1)),
    ((128, 64, 64), (2,), "float32", False, None),  # trailing axes, not taken
    ((64, 8, 8, 32), (1, 2), "float32", True, None),  # middle axes
    ((64, 8, 8, 32), (0, 1, 2, 3), "float64", True, None),  # all axes
    ((64, 8, 8, 32), (), "float32", True, None),
    ((64, 8, 8, 32), (0,), "float16", True, None),
    ((64, 8, 8, 32), (0,), "int32", True, None),
    ((None, 4096), (0,), "float32", True, None),
    ((255, 128), (0,), "float32", True, None),  # one row under the threshold
    ((256, 128), (0,), "float64", True, (256, 128, 0)),
])
def test_sum_as_product_takes_large_float_sums_over_leading_or_trailing_axes(
        shape, axes, dtype, trailing, want):
    # Both modes' rules read it, each with its own threshold (here 32K) and sides.
    from keras_ipu.device.to_tensorflow.array_rules import sum_as_product

    assert sum_as_product(aval(shape, dtype), axes, 1 << 15, trailing) == want


def test_graph_mode_sums_large_leading_axes_as_a_product_only():
    import tensorflow as tf

    from keras_ipu.device.to_tensorflow import emit_graph

    def ops(shape, axes, dtype="float32"):
        graph = one("reduce_sum", [(shape, dtype)], axes=axes)
        fn = tf.function(lambda x: emit_graph(graph, [x], mode="graph"))
        concrete = fn.get_concrete_function(tf.TensorSpec(shape, dtype))
        return {op.type for op in concrete.graph.get_operations()}

    assert "MatMul" in ops((64, 8, 8, 32), (0, 1, 2))
    assert "Sum" not in ops((64, 8, 8, 32), (0, 1, 2))
    for shape, axes, dtype in [((64, 8, 8, 32), (1, 2), "float32"),  # not leading
                               ((64, 8, 8, 32), (0, 1, 2, 3), "float32"),  # all axes
                               ((128, 512), (0,), "float32"),  # small
                               ((64, 8, 8, 32), (0, 1, 2), "int32")]:
        assert "MatMul" not in ops(shape, axes, dtype) and "Sum" in ops(shape, axes, dtype)


def test_logical_reductions_argmax_cumsum(target):
    def body(b, p, x):
        return [
            b.op("reduce_and", p, axes=(1,)), b.op("reduce_or", p, axes=(0,)),
            b.op("argmax", x, axis=1, index_dtype=np.dtype("int32")),
            b.op("argmin", x, axis=0, index_dtype=np.dtype("int32")),
            b.op("cumsum", x, axis=1, reverse=True), b.op("cumprod", x, axis=0),
        ]

    graph = build([aval((3, 4), "bool"), aval((3, 4))], body)
    check(graph, [RNG.random((3, 4)) > 0.3, f32(3, 4)], target)


def test_structure_rules(target):
    def body(b, x, y):
        r = b.op("reshape", x, new_shape=(6, 4))
        t = b.op("transpose", r, permutation=(1, 0))
        c = b.op("concatenate", t, t, axis=-1)
        p = b.op("pad", x, lit(np.float32(9.0)), config=((1, -1, 0), (0, 2, 1), (2, 0, 0)))
        v = b.op("rev", x, axes=(0, 2))
        i = b.op("iota", dtype=np.dtype("int32"), shape=(3, 5), dimension=1)
        s = b.op("slice", x, start_indices=(0, 1, 0), limit_indices=(2, 3, 4), strides=(1, 1, 2))
        bc = b.op("broadcast_to", y, shape=(3, 2, 4))
        return [t, c, p, v, i, s, bc]

    graph = build([aval((2, 3, 4)), aval((2, 4))], body)
    check(graph, [f32(2, 3, 4), f32(2, 4)], target, exact=True)


PADS = [
    ((1, -1, 0), (0, 2, 1), (2, 0, 0)),
    ((1, 1, 2), (-2, 3, 1), (0, -1, 3)),  # holes and crops on one axis
    ((3, -4, 1), (0, 0, 0), (-1, 0, 2)),  # crops deeper than the edge holes
    ((0, 1, 1), (1, 0, 1), (0, 0, 0)),  # a max-pool gradient's tap
]


@pytest.mark.parametrize("config", PADS)
def test_pad_interior_and_negative(config, target):
    graph = one("pad", [((3, 4, 5), "float32"), ((), "float32")], config=config)
    check(graph, [f32(3, 4, 5), np.float32(7.0)], target, exact=True)


@pytest.mark.parametrize("starts,limits,strides", [
    ((0, 1, 0), (3, 4, 5), (2, 1, 2)),
    ((1, 0, 1), (3, 4, 4), (3, 2, 2)),  # the last row short of a stride
    ((0, 0, 4), (3, 4, 5), (1, 5, 1)),
    ((2, 0, 0), (1, 4, 5), (2, 1, 1)),  # empty
])
def test_strided_slices(starts, limits, strides, target):
    graph = one("slice", [((3, 4, 5), "float32")], start_indices=starts,
                limit_indices=limits, strides=strides)
    check(graph, [f32(3, 4, 5)], target, exact=True)


def test_marker_identities(target):
    from keras_ipu.device.compiler import CompileOptions
    from keras_ipu.device.compiler.recompute import RecomputationMode

    def body(b, x):
        c = b.op("recomputation_checkpoint", b.op("sin", x))
        return [b.op("assume_equal_across_replicas", c, inplace=True),
                *b.op("optimization_barrier", c)]

    graph = build([aval((3, 4))], body)
    # Compiled with recomputation on, the checkpoint stays in the program.
    target.use()
    exe = compile_graph(graph, CompileOptions(
        recomputation=RecomputationMode.RecomputeAndBackpropagateInterleaved))
    x = f32(3, 4)
    got = exe.run(x)
    assert engine_choice.current_engine(exe) == target.engine
    assert "recomputation_checkpoint" in str(exe)
    for g in got:
        np.testing.assert_allclose(g, np.sin(x), rtol=1e-6)


def test_copies_between_ipus(target):
    # The placement pass's copies (primitives/inter_ipu.py) pass values on.
    def body(b, x):
        y = b.op("ipu_copy", b.op("sin", x), src=0, dst=1)
        return [b.op("mul", y, x)]

    check(build([aval((3, 4))], body), [f32(3, 4)], target)


def test_dynamic_slices_clamp_their_starts(target):
    def body(b, x, u, i, j):
        return [
            b.op("dynamic_slice", x, i, j, slice_sizes=(2, 3)),
            b.op("dynamic_update_slice", x, u, i, j),
        ]

    graph = build([aval((4, 5)), aval((2, 3)), aval((), "int32"), aval((), "int32")], body)
    for i, j in [(1, 1), (3, 4), (-2, 9)]:
        check(graph, [f32(4, 5), f32(2, 3), np.int32(i), np.int32(j)], target, exact=True)


@pytest.mark.parametrize("mode", ["clip", "fill"])
def test_gather_wraps_negative_and_clips_or_fills(mode, target):
    x = f32(5, 3)
    idx = np.array([[0], [4], [-1], [7], [-9]], np.int32)
    check(one("gather", [((5, 3), "float32"), ((5, 1), "int32")], mode=mode),
          [x, idx], target, exact=True)


def test_gather_with_batch_dims(target):
    x = f32(2, 5, 3)
    idx = np.array([[[1], [4]], [[0], [2]]], np.int32)
    check(one("gather", [((2, 5, 3), "float32"), ((2, 2, 1), "int32")], mode="clip",
              batch_dims=1), [x, idx], target, exact=True)


def test_scatter_with_batch_dims_and_an_embedding_gradient(target):
    def body(b, x, i, u, table, ids, rows):
        return [b.op("scatter", x, i, u, mode="add", batch_dims=1),
                b.op("scatter", table, ids, rows, mode="add")]

    ids = np.array([[3], [0], [3], [11], [7], [3]], np.int32)
    graph = build([aval((2, 5, 3)), aval((2, 2, 1), "int32"), aval((2, 2, 3)),
                   aval((10, 4)), aval((6, 1), "int32"), aval((6, 4))], body)
    check(graph, [f32(2, 5, 3), np.array([[[1], [9]], [[0], [0]]], np.int32), f32(2, 2, 3),
                  np.zeros((10, 4), np.float32), ids, f32(6, 4)], target)


@pytest.mark.parametrize("mode", ["add", "update", "max", "min"])
def test_scatter_drops_out_of_range_rows(mode, target):
    x = f32(5, 3)
    idx = np.array([[0], [2], [-1], [9], [2]], np.int32)
    upd = f32(5, 3)
    if mode == "update":  # duplicate rows: XLA leaves the order open
        idx[4, 0] = 1
    check(one("scatter", [((5, 3), "float32"), ((5, 1), "int32"), ((5, 3), "float32")],
              mode=mode), [x, idx, upd], target)


def test_dot_general_batched_and_transposed(target):
    def body(b, x, y):
        return [
            b.op("dot_general", x, y, dimension_numbers=(((2,), (1,)), ((0,), (0,)))),
            b.op("dot_general", x, y, dimension_numbers=(((1,), (2,)), ((0,), (0,)))),
        ]

    graph = build([aval((3, 4, 5)), aval((3, 5, 4))], body)
    check(graph, [f32(3, 4, 5), f32(3, 5, 4)], target, rtol=1e-5, atol=1e-5)



# Layouts the graph rule maps to MatMul as they are, with its transpose
# flags, or after a transpose; batch dims; integer, bool and half products.
DOTS = [
    ((4, 5), (5, 3), (((1,), (0,)), ((), ())), "float32"),
    ((5, 4), (5, 3), (((0,), (0,)), ((), ())), "float32"),
    ((4, 5), (3, 5), (((1,), (1,)), ((), ())), "float32"),
    ((5, 4), (3, 5), (((0,), (1,)), ((), ())), "float32"),
    ((2, 4, 3, 5), (5, 2, 6), (((3,), (0,)), ((0,), (1,))), "float32"),
    ((3, 2, 4), (4, 3, 2), (((0, 2), (1, 0)), ((), ())), "float32"),
    # Adjacent contracting axes in the same order (the XLA rule merges
    # them): leading (an LSTM's weight gradient over time and batch),
    # trailing, apart in the two operands, and with no elements.
    ((4, 3, 5), (4, 3, 6), (((0, 1), (0, 1)), ((), ())), "float32"),
    ((2, 3, 4), (5, 3, 4), (((1, 2), (1, 2)), ((), ())), "float32"),
    ((2, 3, 4, 5), (3, 4, 6), (((1, 2), (0, 1)), ((), ())), "float32"),
    ((0, 3, 5), (0, 3, 6), (((0, 1), (0, 1)), ((), ())), "float32"),
    ((2, 3), (3,), (((1,), (0,)), ((), ())), "int32"),
    ((3, 4), (4, 2), (((1,), (0,)), ((), ())), "int8"),
    ((3, 4), (4, 2), (((1,), (0,)), ((), ())), "bool"),
    ((3, 4), (4, 2), (((1,), (0,)), ((), ())), "float16"),
]


def test_xla_mode_merges_adjacent_contracting_axes():
    # XLA's CPU backend copies an operand to put its several contracting
    # axes last; one contracting axis it reads in place.
    import tensorflow as tf
    from tensorflow.compiler.xla import xla_data_pb2

    from keras_ipu.device.to_tensorflow import emit_graph

    def contracted(lhs, rhs, dims):
        graph = one("dot_general", [(lhs, "float32"), (rhs, "float32")], dimension_numbers=dims)
        fn = tf.function(lambda *xs: emit_graph(graph, list(xs), mode="xla"), autograph=False)
        concrete = fn.get_concrete_function(tf.TensorSpec(lhs), tf.TensorSpec(rhs))
        (op,) = [op for op in concrete.graph.get_operations() if op.type == "XlaDotV2"]
        d = xla_data_pb2.DotDimensionNumbers.FromString(op.get_attr("dimension_numbers"))
        return list(d.lhs_contracting_dimensions), list(d.rhs_contracting_dimensions)

    assert contracted((32, 128, 64), (32, 128, 512), (((0, 1), (0, 1)), ((), ()))) == ([0], [0])
    assert contracted((2, 3, 4, 5), (3, 4, 6), (((1, 2), (0, 1)), ((), ()))) == ([1], [0])
    # Out of order in one operand: a reshape would pair the wrong elements.
    assert contracted((3, 2, 4), (4, 3, 2), (((0, 2), (1, 0)), ((), ()))) == ([0, 2], [1, 0])


@pytest.mark.parametrize("lhs,rhs,dims,dtype", DOTS)
def test_dot_general_layouts_and_dtypes(lhs, rhs, dims, dtype, target):
    def draw(shape):
        if dtype == "bool":
            return RNG.random(shape) > 0.5
        if dtype.startswith("int"):
            return RNG.integers(-9, 9, shape).astype(dtype)
        return f32(*shape).astype(dtype)

    graph = one("dot_general", [(lhs, dtype), (rhs, dtype)], dimension_numbers=dims)
    check(graph, [draw(lhs), draw(rhs)], target, rtol=2e-3 if dtype == "float16" else 1e-5,
          atol=1e-5)

CONVS = [
    # (lhs shape, rhs shape, dimension numbers, extra params)
    ((2, 9, 9, 3), (3, 3, 3, 4), ((0, 3, 1, 2), (3, 2, 0, 1), (0, 3, 1, 2)), {}),
    ((2, 9, 9, 3), (3, 3, 3, 4), ((0, 3, 1, 2), (3, 2, 0, 1), (0, 3, 1, 2)),
     dict(window_strides=(2, 2), padding=((1, 1), (0, 1)))),
    ((2, 5, 5, 4), (3, 4, 3, 3), ((0, 3, 1, 2), (0, 1, 2, 3), (0, 3, 1, 2)),
     dict(padding=((2, 2), (2, 2)), lhs_dilation=(2, 2))),
    # A weight gradient's layout: the input's batch is the feature.
    ((2, 7, 7, 3), (2, 5, 5, 4), ((3, 0, 1, 2), (3, 0, 1, 2), (0, 1, 2, 3)), {}),
    ((2, 6, 6, 4), (3, 3, 1, 4), ((0, 3, 1, 2), (3, 2, 0, 1), (0, 3, 1, 2)),
     dict(feature_group_count=4, rhs_dilation=(2, 1))),
    ((2, 3, 10), (4, 3, 3), ((0, 1, 2), (0, 1, 2), (0, 1, 2)), dict(padding=((1, 1),))),
    # A strided convolution's input gradient (input dilated), cropping,
    # a dilated window at a stride, groups of several channels, a 1-d
    # depthwise one and a 3-d one.
    ((2, 4, 4, 3), (3, 3, 3, 5), ((0, 3, 1, 2), (3, 2, 0, 1), (0, 3, 1, 2)),
     dict(window_strides=(1, 1), padding=((2, 1), (2, 2)), lhs_dilation=(2, 3))),
    ((2, 8, 8, 3), (3, 3, 3, 4), ((0, 3, 1, 2), (3, 2, 0, 1), (0, 3, 1, 2)),
     dict(padding=((-1, 2), (1, -2)))),
    ((2, 9, 9, 3), (3, 3, 3, 4), ((0, 3, 1, 2), (3, 2, 0, 1), (0, 3, 1, 2)),
     dict(window_strides=(2, 2), rhs_dilation=(2, 1), padding=((1, 1), (1, 1)))),
    ((2, 6, 6, 6), (3, 3, 3, 4), ((0, 3, 1, 2), (3, 2, 0, 1), (0, 3, 1, 2)),
     dict(feature_group_count=2)),
    ((2, 4, 9), (8, 1, 3), ((0, 1, 2), (0, 1, 2), (0, 1, 2)),
     dict(feature_group_count=4, window_strides=(2,))),
    ((1, 2, 5, 5, 4), (3, 2, 2, 2, 2), ((0, 1, 2, 3, 4), (0, 1, 2, 3, 4), (0, 1, 2, 3, 4)),
     dict(padding=((1, 0), (0, 1), (1, 1)))),
    # Weight gradients of a SAME 3x3 convolution and of a stride-2 one (the
    # autodiff's layout: the window is the output gradient, the forward
    # stride its dilation): Conv2DBackpropFilter in the graph mode.
    ((2, 8, 8, 3), (2, 8, 8, 4), ((3, 0, 1, 2), (3, 0, 1, 2), (2, 3, 0, 1)),
     dict(padding=((1, 1), (1, 1)))),
    ((2, 9, 9, 3), (2, 4, 4, 4), ((3, 0, 1, 2), (3, 0, 1, 2), (2, 3, 0, 1)),
     dict(padding=((0, 0), (0, 0)), rhs_dilation=(2, 2))),
    ((2, 8, 8, 3), (2, 4, 4, 4), ((3, 0, 1, 2), (3, 0, 1, 2), (2, 3, 0, 1)),
     dict(padding=((0, 1), (1, 1)), rhs_dilation=(2, 2))),
]


@pytest.mark.parametrize("lhs,rhs,dims,extra", CONVS)
def test_convolutions_in_every_layout(lhs, rhs, dims, extra, target):
    nsp = len(lhs) - 2
    params = dict(window_strides=(1,) * nsp, padding=((0, 0),) * nsp,
                  lhs_dilation=(1,) * nsp, rhs_dilation=(1,) * nsp,
                  dimension_numbers=dims, feature_group_count=1)
    params.update(extra)
    graph = one("conv_general_dilated", [(lhs, "float32"), (rhs, "float32")], **params)
    check(graph, [f32(*lhs), f32(*rhs)], target, rtol=1e-4, atol=1e-5)


def test_depthwise_convolution_with_unequal_strides(target):
    # 2-d, one group per channel, strides (2, 1): TensorFlow's CPU kernel
    # takes equal strides only; the graph mode subsamples a stride-1 result.
    dims = ((0, 3, 1, 2), (3, 2, 0, 1), (0, 3, 1, 2))
    graph = one("conv_general_dilated", [((2, 7, 7, 3), "float32"), ((3, 3, 1, 6), "float32")],
                window_strides=(2, 1), padding=((1, 1), (0, 0)), lhs_dilation=(1, 1),
                rhs_dilation=(1, 1), dimension_numbers=dims, feature_group_count=3)
    check(graph, [f32(2, 7, 7, 3), f32(3, 3, 1, 6)], target, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("op", ["max", "sum", "min"])
def test_reduce_window(op, target):
    graph = one("reduce_window", [((2, 7, 7, 3), "float32")], op=op,
                window_dimensions=(1, 3, 3, 1), window_strides=(1, 2, 2, 1),
                padding=((0, 0), (1, 1), (0, 1), (0, 0)), base_dilation=(1, 1, 1, 1),
                window_dilation=(1, 1, 1, 1))
    check(graph, [f32(2, 7, 7, 3)], target, rtol=1e-5)


@pytest.mark.parametrize("op,dtype", [("max", "float32"), ("sum", "float16"),
                                      ("min", "float32")])
def test_reduce_window_on_axes_apart_with_dilated_base(op, dtype, target):
    # Windows on axes 0 and 2 (the pool's batch and channels folded from
    # the others), the base dilated, half sums accumulated in float32.
    graph = one("reduce_window", [((5, 3, 6, 2), dtype)], op=op,
                window_dimensions=(2, 1, 3, 1), window_strides=(1, 1, 2, 1),
                padding=((1, 0), (0, 0), (1, 1), (0, 0)), base_dilation=(1, 1, 2, 1),
                window_dilation=(1, 1, 1, 1))
    check(graph, [f32(5, 3, 6, 2).astype(dtype)], target,
          rtol=2e-3 if dtype == "float16" else 1e-5)


# (shape, window, strides, padding, dtype): a 2x2 pool, overlapping padded
# windows, one windowed axis, three windowed axes apart, float16.
SCATTER_CASES = [
    ((2, 6, 6, 3), (1, 2, 2, 1), (1, 2, 2, 1), ((0, 0),) * 4, "float32"),
    ((2, 7, 6, 3), (1, 3, 3, 1), (1, 2, 1, 1), ((0, 0), (1, 1), (0, 1), (0, 0)), "float32"),
    ((3, 9), (1, 3), (1, 2), ((0, 0), (1, 1)), "float32"),
    ((4, 2, 5, 4, 3), (2, 1, 2, 2, 1), (2, 1, 1, 2, 1), ((0, 0),) * 5, "float32"),
    ((2, 6, 6, 3), (1, 3, 3, 1), (1, 1, 1, 1), ((0, 0), (1, 1), (1, 1), (0, 0)), "float16"),
]


@pytest.mark.parametrize("op", ["max", "min"])
@pytest.mark.parametrize("case", SCATTER_CASES, ids=lambda c: f"{c[0]}-{c[4]}")
def test_select_and_scatter_add_takes_the_first_extremum(op, case, target):
    # MaxPoolGrad / MaxPool3DGrad (XLA: its select-and-scatter) against the
    # NumPy kernel. Few distinct values (ties in most windows) and integer
    # cotangents (exact sums in any order): equal bits unless a pick differs.
    shape, window, strides, padding, dtype = case
    params = dict(window_dimensions=window, window_strides=strides, padding=padding,
                  window_dilation=(1,) * len(shape))

    def body(b, g, x):
        y = b.op("reduce_window", x, op=op, base_dilation=(1,) * len(shape), **params)
        return [b.op("select_and_scatter_add", g, x, y, op=op, **params)]

    y_shape = one("reduce_window", [(shape, dtype)], op=op,
                  base_dilation=(1,) * len(shape), **params).outputs[0].aval.shape
    graph = build([aval(y_shape, dtype), aval(shape, dtype)], body)
    x = RNG.integers(0, 3, shape).astype(dtype)
    g = RNG.integers(-4, 5, y_shape).astype(dtype)
    windowed = sum(k != 1 or s != 1 for k, s in zip(window, strides))
    if target.engine == "tensorflow" and windowed == 3 and not onednn_enabled():
        # Eigen's MaxPool3DGrad credits every tied maximum: the graph
        # runtime refuses the program rather than give other numbers.
        with pytest.raises(RuntimeError, match="MaxPool3DGrad without oneDNN"):
            run_both(graph, [g, x], target)
        return
    check(graph, [g, x], target, exact=True)


@pytest.mark.parametrize("bit_width,stream", [(32, 0), (8, 3), (64, 2**40 + 5)])
def test_random_bits_are_the_numpy_bits(bit_width, stream, target):
    graph = one("random_bits", [((2,), "uint32")], shape=(3, 5), bit_width=bit_width,
                stream=stream)
    check(graph, [np.array([1234, 99], np.uint32)], target, exact=True)


def _jit_both(fn, args, target):
    from keras_ipu.device.jit import jit

    target.monkeypatch.setenv(engine_choice.ENV, "numpy")
    want = jit(fn)(*args)
    target.use()
    fast = jit(fn)
    got = fast(*args)
    return want, got


def test_control_flow_scan_while_and_cond(target):
    import keras

    def fn(x, n):
        def step(carry, xs):
            carry = carry * 0.5 + xs
            return carry, carry.sum()

        last, sums = keras.ops.scan(step, keras.ops.zeros((3,)), x, reverse=True)
        loop = keras.ops.fori_loop(0, n, lambda i, v: v + i, last)
        branch = keras.ops.cond(n > 2, lambda: loop * 2.0, lambda: loop - 1.0)
        return sums, loop, branch

    x = f32(5, 3)
    for n in (1, 4):
        want, got = _jit_both(fn, (x, np.int32(n)), target)
        for w, g in zip(want, got):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def test_both_modes_have_a_rule_for_the_same_primitives_and_graph_rules_no_xla_ops():
    from keras_ipu.device.to_tensorflow import MODE_RULES
    from keras_ipu.device.to_tensorflow import emit_graph

    assert set(MODE_RULES["graph"]) == set(MODE_RULES["xla"])
    # A max-pool's training step in graph mode: TensorFlow's own kernels
    # only (XLA's ops have no kernel outside XLA).
    import tensorflow as tf

    def body(b, x, w):
        y = b.op("conv_general_dilated", x, w, window_strides=(1, 1), padding=((1, 1), (1, 1)),
                 lhs_dilation=(1, 1), rhs_dilation=(1, 1),
                 dimension_numbers=((0, 3, 1, 2), (3, 2, 0, 1), (0, 3, 1, 2)),
                 feature_group_count=1)
        p = b.op("reduce_window", y, op="max", window_dimensions=(1, 2, 2, 1),
                 window_strides=(1, 2, 2, 1), padding=((0, 0),) * 4,
                 base_dilation=(1,) * 4, window_dilation=(1,) * 4)
        padded = b.op("pad", p, lit(np.float32(0.0)), config=((0, 0, 0), (1, 0, 1), (0, 1, 1),
                                                               (0, 0, 0)))
        grad = b.op("select_and_scatter_add", p, y, p, op="max",
                    window_dimensions=(1, 2, 2, 1), window_strides=(1, 2, 2, 1),
                    padding=((0, 0),) * 4, window_dilation=(1,) * 4)
        return [padded, grad]

    graph = build([aval((2, 6, 6, 3)), aval((3, 3, 3, 4))], body)
    ops = {}
    for mode in ("xla", "graph"):
        fn = tf.function(lambda x, w, mode=mode: emit_graph(graph, [x, w], mode=mode))
        concrete = fn.get_concrete_function(tf.TensorSpec((2, 6, 6, 3)), tf.TensorSpec((3, 3, 3, 4)))
        ops[mode] = {op.type for op in concrete.graph.get_operations()}
    assert {t for t in ops["xla"] if t.startswith("Xla")}  # the check can see them
    assert not {t for t in ops["graph"] if t.startswith("Xla")}, ops["graph"]
    # The max pool's gradient is TensorFlow's one kernel, not per-tap slices.
    assert {"Conv2D", "MaxPool", "MaxPoolGrad"} <= ops["graph"]
    assert not {"StridedSlice", "SelectV2", "Select"} & ops["graph"], ops["graph"]


def _broadcasts_and_padded_sums(b, x, s, g):
    # s (4, 1, 3) broadcast to x's (4, 5, 3): read by mul and select
    # beside full-shape operands (left to TensorFlow's kernels to
    # broadcast), and once more as a graph output (materialised). g's
    # pieces zero-padded into a (4, 10) sum (one concatenate), and a
    # product's transpose (folded into the product).
    wide = b.op("broadcast_to", s, shape=(4, 5, 3))
    kept = b.op("broadcast_to", s, shape=(4, 5, 3))
    prod = b.op("mul", x, wide)
    picked = b.op("select", b.op("gt", x, lit(np.float32(0))), wide, prod)
    left = b.op("pad", g, lit(np.float32(0)), config=((0, 0, 0), (0, 5, 0)))
    right = b.op("pad", g, lit(np.float32(0)), config=((0, 0, 0), (5, 0, 0)))
    dot = b.op("dot_general", g, g, dimension_numbers=(((0,), (0,)), ((), ())))
    return [picked, kept, b.op("add", left, right),
            b.op("transpose", dot, permutation=(1, 0))]


_BROADCAST_AVALS = [((4, 5, 3), "float32"), ((4, 1, 3), "float32"), ((4, 5), "float32")]


def test_implicit_broadcasts_and_graph_runtime_rewrites_keep_values(target):
    graph = build([aval(*a) for a in _BROADCAST_AVALS], _broadcasts_and_padded_sums)
    check(graph, [f32(4, 5, 3), f32(4, 1, 3), f32(4, 5)], target)


def test_graph_mode_leaves_broadcasts_to_readers_and_concatenates_padded_sums():
    import tensorflow as tf

    from keras_ipu.device.to_tensorflow import emit_graph

    graph = build([aval(*a) for a in _BROADCAST_AVALS], _broadcasts_and_padded_sums)
    fn = tf.function(lambda *xs: emit_graph(graph, list(xs), mode="graph"))
    concrete = fn.get_concrete_function(*[tf.TensorSpec(s, d) for s, d in _BROADCAST_AVALS])
    ops = [op.type for op in concrete.graph.get_operations()]
    assert ops.count("BroadcastTo") == 1, ops  # the graph output only
    assert "ConcatV2" in ops and "Pad" not in ops and "PadV2" not in ops, ops
    assert "Transpose" not in ops, ops


def test_xla_mode_concatenates_padded_sums():
    # XLA fuses pads and their sum into a loop testing each piece's bounds
    # per element (the LSTM's backward scan); a concatenate is one copy.
    import tensorflow as tf

    from keras_ipu.device.to_tensorflow import emit_graph

    graph = build([aval(*a) for a in _BROADCAST_AVALS], _broadcasts_and_padded_sums)
    fn = tf.function(lambda *xs: emit_graph(graph, list(xs), mode="xla"), autograph=False)
    concrete = fn.get_concrete_function(*[tf.TensorSpec(s, d) for s, d in _BROADCAST_AVALS])
    ops = [op.type for op in concrete.graph.get_operations()]
    assert "ConcatV2" in ops and "XlaPad" not in ops, ops


def _softmax_and_its_gradient(axis):
    from keras_ipu.backend.nn_ops.normalization import softmax
    from keras_ipu.device import autodiff
    from keras_ipu.device.trace import trace_flat

    def fn(x, g):
        y, pull = autodiff.vjp(lambda x: softmax(x, axis=axis), x)
        return [y, pull(g)[0]]

    graph, _ = trace_flat(fn, [aval((3, 5, 7)), aval((3, 5, 7))])
    return graph


@pytest.mark.parametrize("axis", [-1, 1])
def test_softmax_and_its_gradient_keep_values(axis, target):
    # The last axis: TensorFlow's Softmax and its gradient's formula in the
    # graph mode (graph_softmax.py); another axis: the primitives.
    graph = _softmax_and_its_gradient(axis)
    check(graph, [f32(3, 5, 7, low=-8.0, high=8.0), f32(3, 5, 7)], target)


def _graph_mode_ops(graph, avals):
    import tensorflow as tf

    from keras_ipu.device.to_tensorflow import emit_graph

    fn = tf.function(lambda *xs: emit_graph(graph, list(xs), mode="graph"), autograph=False)
    return fn.get_concrete_function(*[tf.TensorSpec(s, d) for s, d in avals]).graph


def test_graph_mode_emits_softmax_and_its_gradient_as_tensorflow_does():
    graph = _graph_mode_ops(_softmax_and_its_gradient(-1), [((3, 5, 7), "float32")] * 2)
    y, dx = (t.op.inputs[0] if t.op.type == "Identity" else t for t in graph.outputs)
    # y is Softmax; dx reads it and not the exponential or the division.
    assert y.op.type == "Softmax", y.op.type

    def makers(t, seen):
        for u in t.op.inputs:
            if u.op.name not in seen:
                seen.add(u.op.name)
                makers(u, seen)
        return {graph.get_operation_by_name(n).type for n in seen}

    types = makers(dx, set())
    assert "Softmax" in types and not {"Exp", "RealDiv", "Reciprocal"} & types, types
    # Over another axis the primitives are emitted as they are.
    other = _graph_mode_ops(_softmax_and_its_gradient(1), [((3, 5, 7), "float32")] * 2)
    assert "Softmax" not in {op.type for op in other.get_operations()}


def _tiling_and_other_slices(b, x, z):
    # x's columns cut in three pieces that tile it (out of order); z's in
    # two that leave a gap.
    def cut(v, lo, hi):
        return b.op("slice", v, start_indices=(0, lo), limit_indices=(4, hi), strides=(1, 1))

    return [cut(x, 7, 12), cut(x, 0, 3), cut(x, 3, 7), cut(z, 0, 3), cut(z, 4, 12)]


def test_slices_tiling_a_value_are_one_split(target):
    avals = [((4, 12), "float32")] * 2
    graph = build([aval(*a) for a in avals], _tiling_and_other_slices)
    check(graph, [f32(4, 12), f32(4, 12)], target, exact=True)
    ops = [op.type for op in _graph_mode_ops(graph, avals).get_operations()]
    assert ops.count("SplitV") == 1 and ops.count("StridedSlice") == 2, ops


def _activation_gradients(b, y, g):
    # The autodiff's gradients of the logistic and tanh at their result y.
    one = lit(np.float32(1))
    sigmoid = b.op("mul", g, b.op("mul", y, b.op("sub", one, y)))
    tanh = b.op("mul", b.op("sub", one, b.op("mul", y, y)), g)
    return [sigmoid, tanh]


def test_activation_gradients_keep_their_bits(target):
    avals = [((8, 16), "float32")] * 2
    graph = build([aval(*a) for a in avals], _activation_gradients)
    # TensorFlow's kernels compute g * (y * (1 - y)) and g * (1 - y * y) as
    # NumPy does (XLA may contract into fused multiply-adds).
    check(graph, [f32(8, 16, low=0.0, high=1.0), f32(8, 16)], target,
          exact=target.engine == "tensorflow")


def test_graph_mode_emits_activation_gradients_as_tensorflows_kernels():
    graph = build([aval((8, 16))] * 2, _activation_gradients)
    ops = _graph_mode_ops(graph, [((8, 16), "float32")] * 2)
    sigmoid, tanh = (t.op.inputs[0] if t.op.type == "Identity" else t for t in ops.outputs)
    assert (sigmoid.op.type, tanh.op.type) == ("SigmoidGrad", "TanhGrad")


def _relu_gradients(x, g):
    from keras_ipu.backend.nn_ops import _lax as lax
    from keras_ipu.device import autodiff
    from keras_ipu.device.trace import trace_flat

    def fn(x, g):
        # max(x, 0) as relu writes it, and max(0, x), whose share of x
        # differs at a NaN x (all of g): the autodiff's shares (ties half).
        _, pull = autodiff.vjp(lambda x: lax.maximum(x, 0), x)
        _, pull_flipped = autodiff.vjp(lambda x: lax.maximum(0, x), x)
        return [pull(g)[0], pull_flipped(g)[0]]

    graph, _ = trace_flat(fn, [aval(x.shape), aval(g.shape)])
    return graph


def _relu_cases():
    # Every x class (ties of both signs, infinities, NaN) against every g
    # class (signs, zeros, infinities, NaN): the products' zero signs and NaNs.
    f = np.float32
    xs = np.array([0.0, -0.0, 1.5, -1.5, np.inf, -np.inf, np.nan,
                   np.finfo(f).max, -np.finfo(f).max, np.finfo(f).tiny], f)
    gs = np.array([2.0, -3.0, 0.0, -0.0, np.inf, -np.inf, np.nan, 0.25], f)
    x, g = np.meshgrid(xs, gs, indexing="ij")
    return x, g


def test_relu_gradients_keep_their_bits(target):
    x, g = _relu_cases()
    want, got = run_both(_relu_gradients(x, g), [x, g], target)
    for w, r in zip(want, got):
        np.testing.assert_array_equal(r.view(np.uint32), w.view(np.uint32))


def test_graph_mode_emits_relu_gradients_as_two_kernels():
    x, g = _relu_cases()
    ops = _graph_mode_ops(_relu_gradients(x, g), [(x.shape, "float32")] * 2)
    relu, flipped = (t.op.inputs[0] if t.op.type == "Identity" else t for t in ops.outputs)
    assert relu.op.type == "FakeQuantWithMinMaxArgsGradient", relu.op.type
    assert relu.op.inputs[0].op.type == "LeakyReluGrad"
    # max(0, x)'s gradient is left to the primitives.
    assert flipped.op.type == "Mul" and flipped.op.inputs[1].op.type == "SelectV2"


def _unit_axis_transposes(b, x, s):
    # x (4, 1, 6) with its unit axis moved (the data's order kept), and a
    # chain reading a broadcast of s: both need no copy in the graph mode.
    moved = b.op("transpose", x, permutation=(1, 0, 2))
    wide = b.op("broadcast_to", s, shape=(4, 1, 6))
    chain = b.op("neg", b.op("mul", x, wide))
    return [b.op("add", moved, lit(np.float32(1))), b.op("transpose", chain, permutation=(2, 0, 1))]


def test_unit_axis_transposes_are_reshapes_and_chains_broadcast_as_they_read(target):
    avals = [((4, 1, 6), "float32"), ((4, 1, 1), "float32")]
    graph = build([aval(*a) for a in avals], _unit_axis_transposes)
    check(graph, [f32(4, 1, 6), f32(4, 1, 1)], target, exact=True)
    exe = compile_graph(graph)
    assert "fused_elementwise" in [n.primitive.name for n in exe.graph.nodes]
    ops = [op.type for op in _graph_mode_ops(exe.graph, avals).get_operations()]
    assert ops.count("Transpose") == 1 and "BroadcastTo" not in ops, ops


def _two_products_of_one_value(b, x, y1, y2):
    # x (B, S, H, D) read as attention's keys are: contracted over D by one
    # product and over S by another, batched over (B, H) in both.
    forward = b.op("dot_general", y1, x, dimension_numbers=(((3,), (3,)), ((0, 1), (0, 2))))
    backward = b.op("dot_general", y2, x, dimension_numbers=(((3,), (1,)), ((0, 1), (0, 2))))
    return [forward, backward]


_PRODUCT_AVALS = [((2, 5, 3, 4), "float32"), ((2, 3, 6, 4), "float32"),
                  ((2, 3, 6, 5), "float32")]


def test_products_reading_one_value_transpose_it_once(target):
    graph = build([aval(*a) for a in _PRODUCT_AVALS], _two_products_of_one_value)
    check(graph, [f32(*shape) for shape, _ in _PRODUCT_AVALS], target)
    ops = _graph_mode_ops(graph, _PRODUCT_AVALS).get_operations()
    assert [op.type for op in ops].count("Transpose") == 1


# Batched products whose left operand is read transposed (contracted over
# its first non-batch axis): attention's key gradient (probabilities (S, T)
# read as (T, S), times the queries (S, D)), and the value gradient's
# layout, whose transposed operand is the smaller one.
_TRANSPOSED_LEFT = [
    ((3, 6, 5), (3, 6, 2), (((1,), (1,)), ((0,), (0,)))),
    ((2, 3, 6, 1, 5), (2, 6, 3, 1, 2), (((2, 3), (1, 3)), ((0, 1), (0, 2)))),
    ((3, 6, 2), (3, 6, 5), (((1,), (1,)), ((0,), (0,)))),
    ((3, 6, 5), (3, 2, 6), (((1,), (2,)), ((0,), (0,)))),
]


@pytest.mark.parametrize("lhs,rhs,dims", _TRANSPOSED_LEFT)
def test_batched_products_read_the_smaller_operand_transposed(lhs, rhs, dims, target):
    avals = [(lhs, "float32"), (rhs, "float32")]
    graph = one("dot_general", avals, dimension_numbers=dims)
    check(graph, [f32(*lhs), f32(*rhs)], target)
    if target.engine != "tensorflow":
        return
    ops = _graph_mode_ops(graph, avals).get_operations()
    products = [op for op in ops if op.type.startswith("BatchMatMul")]
    assert len(products) == 1, [op.type for op in ops]
    x, y = (t.shape.num_elements() for t in products[0].inputs)
    if products[0].get_attr("adj_x"):
        assert x < y, (products[0].inputs[0].shape, products[0].inputs[1].shape)


def _two_scans():
    # A forward scan's stacked outputs read by a reverse scan (an RNN's
    # residuals in its backward loop) and its last step sliced (an RNN's
    # last output).
    import keras

    from keras_ipu.device.trace import trace_flat

    def fn(x):
        def forward(c, xt):
            c = c * 0.5 + xt
            return c, [c, c * xt]

        _, (hs, prods) = keras.ops.scan(forward, keras.ops.zeros((4,)), x)

        def backward(c, xs):
            h, p = xs
            c = c * h + p
            return c, c

        total, back = keras.ops.scan(backward, keras.ops.zeros((4,)), (hs, prods),
                                     reverse=True)
        return [total, back, hs[-1:], hs[1:3]]

    graph, _ = trace_flat(fn, [aval((6, 4))])
    return graph


def test_scans_hand_over_their_stacked_outputs_and_keep_values(target):
    check(_two_scans(), [f32(6, 4)], target)


def test_graph_mode_reads_a_scans_steps_from_its_arrays_without_stacking():
    graph = _graph_mode_ops(_two_scans(), [((6, 4), "float32")])
    seen, stack = set(), [t.op for t in graph.outputs]
    while stack:
        op = stack.pop()
        if op.name not in seen:
            seen.add(op.name)
            stack.extend(t.op for t in op.inputs)
    stacks = [n for n in seen if graph.get_operation_by_name(n).type == "TensorListStack"]
    # The reverse scan's own output and hs (its 2-step slice reads the
    # stack); prods and hs' last step come from the arrays.
    assert len(stacks) == 2, stacks


# -- the engine choice ------------------------------------------------------


def _mlp_losses(engine, extra_env=None, prelude=""):
    # As in a user's environment: no jax (a test-only reference here; its
    # import sets TensorFlow's log level) and no TensorFlow log level set.
    code = "import sys\nsys.modules['jax'] = None\n" + prelude + textwrap.dedent(
        """
        import numpy as np, keras
        from keras import layers
        rng = np.random.default_rng(0)
        x = rng.standard_normal((64, 20)).astype("float32")
        y = rng.integers(0, 4, 64)
        keras.utils.set_random_seed(1)
        m = keras.Sequential([keras.Input((20,)), layers.Dense(32, activation="relu"),
                              layers.Dropout(0.2), layers.Dense(4)])
        m.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(
            from_logits=True), steps_per_execution=2)
        h = m.fit(x, y, batch_size=16, epochs=2, verbose=0, shuffle=False)
        import sys
        from keras_ipu.device.compiler import engine_choice
        from keras_ipu.device.compiler.executable import Executable
        import gc
        used = sorted({engine_choice.current_engine(e) for e in gc.get_objects()
                       if isinstance(e, Executable) and e.name == "train_step_loop"})
        print(h.history["loss"], used, "keras_ipu.device.to_tensorflow" in sys.modules)
        """
    )
    env = {k: v for k, v in os.environ.items() if k != tensorflow_runtime.TF_LOG_LEVEL_ENV}
    env.update(KERAS_BACKEND="ipu", KERAS_IPU_ENGINE=engine, **(extra_env or {}))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, timeout=HANG_LIMIT_S)
    assert out.returncode == 0, out.stderr[-3000:]
    line = out.stdout.strip().splitlines()[-1]
    losses = eval(line[: line.index("]") + 1])
    rest = line[line.index("]") + 1:].split()
    if "['xla']" in rest:
        # TensorFlow's C++ INFO lines stay out of the user's output.
        assert "XLA service" not in out.stderr and "Compiled cluster" not in out.stderr, \
            out.stderr[-3000:]
    return losses, rest


def test_our_tensorflow_import_is_quiet_unless_the_user_chose():
    environ = {}
    tensorflow_runtime.quiet_tensorflow_start(environ, modules={})
    assert environ == {tensorflow_runtime.TF_LOG_LEVEL_ENV: "1"}  # INFO off, warnings on
    environ = {tensorflow_runtime.TF_LOG_LEVEL_ENV: "0"}
    tensorflow_runtime.quiet_tensorflow_start(environ, modules={})
    assert environ == {tensorflow_runtime.TF_LOG_LEVEL_ENV: "0"}
    # The user imported TensorFlow: its logging is theirs.
    environ = {}
    tensorflow_runtime.quiet_tensorflow_start(environ, modules={"tensorflow": object()})
    assert environ == {}


def test_tensorflows_pools_take_the_host_thread_cap_unless_the_user_sized_them():
    intra, inter = tensorflow_runtime.TF_POOL_VARIABLES
    assert tensorflow_runtime.tensorflow_pool_sizes({}) == {}  # TensorFlow's default: the cores
    # A cap of 1: one thread in each pool (XLA then runs on the caller alone).
    assert tensorflow_runtime.tensorflow_pool_sizes({"KERAS_IPU_HOST_THREADS": "1"}) == {intra: 1, inter: 1}
    # The smallest cap set, as for the NumPy engine's kernels.
    assert tensorflow_runtime.tensorflow_pool_sizes(
        {"OMP_NUM_THREADS": "4", "OPENBLAS_NUM_THREADS": "2"}) == {intra: 2, inter: 2}
    assert tensorflow_runtime.tensorflow_pool_sizes({"OMP_NUM_THREADS": "4"}) == {intra: 4, inter: 4}
    # TensorFlow's own variable is the user's word for its pool.
    assert tensorflow_runtime.tensorflow_pool_sizes(
        {"KERAS_IPU_HOST_THREADS": "1", intra: "3"}) == {inter: 1}
    assert tensorflow_runtime.tensorflow_pool_sizes(
        {"MKL_NUM_THREADS": "2", intra: "2", inter: "2"}) == {}


_POOLS = """
import sys
sys.modules['jax'] = None
{prelude}
from keras_ipu.device.compiler import tensorflow_runtime
tf = tensorflow_runtime.import_tensorflow()
tf.add(tf.constant(1.0), 1.0)  # the runtime started: its pools made
config = tf.config.threading
print(config.get_intra_op_parallelism_threads(), config.get_inter_op_parallelism_threads())
"""


@pytest.mark.parametrize("env, prelude, sizes", [
    ({"KERAS_IPU_HOST_THREADS": "1"}, "", "1 1"),
    # 0: TensorFlow reads its variable (or takes the cores).
    ({"KERAS_IPU_HOST_THREADS": "1", "TF_NUM_INTRAOP_THREADS": "2"}, "", "0 1"),
    ({}, "", "0 0"),
    # The user sized a pool, or started TensorFlow's runtime, before us.
    ({"OPENBLAS_NUM_THREADS": "1"},
     "import tensorflow as tf; tf.config.threading.set_intra_op_parallelism_threads(3)", "3 1"),
    ({"OPENBLAS_NUM_THREADS": "1"}, "import tensorflow as tf; tf.add(1.0, 1.0)", "0 0"),
])
def test_our_tensorflow_start_sizes_its_pools(env, prelude, sizes):
    from keras_ipu.device.native import threads

    unset = {*threads.CAP_VARIABLES, *tensorflow_runtime.TF_POOL_VARIABLES}
    environ = {k: v for k, v in os.environ.items() if k not in unset}
    out = subprocess.run([sys.executable, "-c", _POOLS.format(prelude=prelude)],
                         env={**environ, **env}, capture_output=True, text=True,
                         timeout=HANG_LIMIT_S)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == sizes


def test_fit_on_each_tensorflow_engine_matches_numpy_and_numpy_never_emits():
    numpy_losses, numpy_rest = _mlp_losses("numpy")
    assert numpy_rest == ["['numpy']", "False"]
    for engine in ("xla", "tensorflow"):
        losses, rest = _mlp_losses(engine, {engines.STRICT_ENV: "1"})
        np.testing.assert_allclose(losses, numpy_losses, rtol=1e-5)
        assert rest == [f"['{engine}']", "True"]
    # The default (auto): a program this short never leaves NumPy.
    auto_losses, auto_rest = _mlp_losses("auto")
    assert auto_losses == numpy_losses and auto_rest == ["['numpy']", "False"]


# auto, made to switch at once to one candidate: the first run on NumPy
# starts the compile and waits until the candidate is handed over; the
# fit's three runs after are the candidate's and NumPy's in turn (the
# donated state crosses both ways): the graph runtime's preparing run, then
# timed runs; XLA's one warm-up run, then timed runs.
_SWITCH_AT_ONCE = textwrap.dedent(
    """
    import time
    from keras_ipu.device.compiler import tiered_runner as _tiered_runner
    _tiered_runner.HOT_SECONDS = 0.0
    _tiered_runner.MIN_PREDICTED_GAIN = float("-inf")  # tried, whatever it is predicted to save
    _tiered_runner.TIMED_RUNS = 10**6
    _tiered_runner.WARM_UP_RUNS = {warm_up}
    _tiered_runner.AUTO_CANDIDATES = ({engine!r},)
    _tiered_runner.host_threads._cap = 2  # a core to compile on, on any machine
    # Waited for below: at nice 19 on a busy machine it would crawl.
    _tiered_runner.host_threads.background_priority = lambda: None
    _start = _tiered_runner.TieredRunner._start_compile
    def _start_and_wait(self, arrays):
        _start(self, arrays)
        while self.engine not in ("timing", "preparing") and self.thread.is_alive():
            time.sleep(0.01)
    _tiered_runner.TieredRunner._start_compile = _start_and_wait
    _prepare = _tiered_runner.TieredRunner._prepare_here
    def _prepare_and_wait(self, arrays):
        out = _prepare(self, arrays)
        while self.engine != "timing" and self.thread.is_alive():
            time.sleep(0.01)
        return out
    _tiered_runner.TieredRunner._prepare_here = _prepare_and_wait
    """
)


@pytest.mark.parametrize("engine", ["tensorflow", "xla"])
def test_auto_switching_engines_mid_fit_matches_numpy(engine):
    # Donated state crosses from NumPy to the candidate mid-epoch; the
    # losses stay within the tolerance the engine meets alone.
    numpy_losses, _ = _mlp_losses("numpy")
    warm_up = 0 if engine in tiered_runner.CALLER_PREPARES else 1
    auto_losses, auto_rest = _mlp_losses(
        "auto", {engines.STRICT_ENV: "1"},
        prelude=_SWITCH_AT_ONCE.format(engine=engine, warm_up=warm_up))
    assert auto_rest == [f"['{engine}']", "True"]
    np.testing.assert_allclose(auto_losses, numpy_losses, rtol=1e-5)


def _graph():
    def body(b, x, w):
        y = b.op("dot_general", x, w, dimension_numbers=(((1,), (0,)), ((), ())))
        return [b.op("max", y, lit(np.float32(0.0))), b.op("reduce_sum", y, axes=(0, 1))]

    return build([aval((8, 6)), aval((6, 5))], body)


def _a_run_prepares(monkeypatch):
    """A runner of _graph(), the compile thread's ask (a thread standing
    for it) and the run that prepares the graph runtime: (the runner, what
    the ask got, the run's results, NumPy's results)."""
    monkeypatch.setattr(tiered_runner.host_threads, "_cap", 2)
    exe = compile_graph(_graph())
    arrays = [f32(8, 6), f32(6, 5)]
    want = exe.run_unchecked(list(arrays))
    runner = tiered_runner.TieredRunner(exe)
    got = []
    thread = threading.Thread(target=lambda: got.append(runner._prepared_by_caller("tensorflow")))
    thread.start()
    _wait_for(runner, "preparing")
    out = runner(arrays)
    thread.join(timeout=60)
    return runner, got[0], out, want


def _threads_building_graph_programs(monkeypatch, program=engines.GraphProgram):
    """The list `program`.build (GraphProgram's, XlaProgram's) appends its
    calling thread to from now."""
    threads = []
    build = program.build.__func__

    def noting_build(cls, executable, check=None):
        threads.append(threading.current_thread())
        return build(cls, executable, check)

    monkeypatch.setattr(program, "build", classmethod(noting_build))
    return threads


def test_the_graph_runtime_is_prepared_by_a_run_of_the_program(monkeypatch):
    # Not in the niced background (which a busy machine starves): the run
    # that finds the compile thread asking traces the candidate in the
    # caller's thread and returns the candidate's results of its inputs;
    # the compile thread gets the program and the CPU it took.
    traced_in = _threads_building_graph_programs(monkeypatch)
    runner, (program, cpu), out, want = _a_run_prepares(monkeypatch)
    assert traced_in == [threading.main_thread()] and runner.last_engine == "tensorflow"
    assert isinstance(program, engines.GraphProgram) and cpu > 0
    assert runner.engine == "compiling"  # the compile thread hands it over for timing
    for g, wv in zip(out, want):
        np.testing.assert_allclose(g, wv, rtol=1e-5, atol=1e-6)


def test_a_candidate_that_fails_in_the_callers_run_leaves_that_run_to_the_engine_so_far(monkeypatch):
    def refusing_run(self, arrays):
        raise ValueError("a kernel refused these inputs")

    monkeypatch.setattr(engines.GraphProgram, "run", refusing_run)
    runner, (program, _), out, want = _a_run_prepares(monkeypatch)
    assert program is None and runner.last_engine == "numpy"
    for g, wv in zip(out, want):
        np.testing.assert_array_equal(g, wv)


def _wait_for(runner, engine):
    deadline = time.monotonic() + 120
    while runner.engine != engine and time.monotonic() < deadline:
        time.sleep(0.01)
    assert runner.engine == engine


def test_auto_times_each_candidate_in_turn_and_keeps_the_fastest(monkeypatch, caplog):
    monkeypatch.setenv(engine_choice.ENV, "auto")
    monkeypatch.setattr(tiered_runner, "HOT_SECONDS", 1e-9)
    monkeypatch.setattr(tiered_runner, "MIN_PREDICTED_GAIN", float("-inf"))
    monkeypatch.setattr(tiered_runner, "RENT_FACTOR", 0.0)  # XLA at once (its rent: below)
    monkeypatch.setattr(tiered_runner.host_threads, "_cap", 2)
    # Waited for below: at nice 19 on a busy machine it would crawl.
    monkeypatch.setattr(tiered_runner.host_threads, "background_priority", lambda: None)
    exe = compile_graph(_graph())
    x, w = f32(8, 6), f32(6, 5)
    want = exe.run_unchecked([x, w])
    outs = [exe.run(x, w)]  # NumPy; the next run starts the compile
    runner = exe._engine_run
    assert isinstance(runner, tiered_runner.TieredRunner) and runner.engine == "numpy"
    with caplog.at_level("INFO", logger="keras_ipu.device"):
        outs.append(exe.run(x, w))
        # (TensorFlow imported by an earlier test: the compile thread may
        # already ask for the graph runtime's preparation.)
        assert runner.engine in ("compiling", "preparing")
        seen = []
        for engine in tiered_runner.AUTO_CANDIDATES:
            if engine in tiered_runner.CALLER_PREPARES:
                # The next run prepares it, in this thread, and gives its results.
                _wait_for(runner, "preparing")
                outs.append(exe.run(x, w))
                assert engine_choice.current_engine(exe) == engine
            _wait_for(runner, "timing")
            assert runner.candidate.engine == engine
            so_far = runner.current_name
            seen.append(engine)
            # The candidate's warm-up runs, then the engine so far and the
            # candidate in turn.
            ran = []
            for _ in range(tiered_runner.WARM_UP_RUNS + 2 * tiered_runner.TIMED_RUNS):
                outs.append(exe.run(x, w))
                ran.append(engine_choice.current_engine(exe))
            assert ran == ([engine] * tiered_runner.WARM_UP_RUNS
                           + [so_far, engine] * tiered_runner.TIMED_RUNS)
            # The compile thread waited for the timing before going on.
            assert runner.engine in ("compiling", "timing", "final")
        runner.thread.join(timeout=120)
        assert runner.engine == "final"
        outs += [exe.run(x, w) for _ in range(2)]
    assert seen == ["tensorflow", "xla"]
    kept = runner.current_name
    assert kept in ("numpy", "tensorflow", "xla") and engine_choice.current_engine(exe) == kept
    decisions = [r.message for r in caplog.records if "per run: keeps" in r.message]
    assert len(decisions) == 2 and decisions[-1].endswith(f"keeps {kept}"), decisions
    for out in outs:
        for g, wv in zip(out, want):
            np.testing.assert_allclose(g, wv, rtol=1e-5, atol=1e-6)


def test_a_timed_trial_of_xla_runs_its_turns_and_is_final(monkeypatch):
    # Two host threads, no XLA prediction, the graph runtime predicted to
    # gain nothing: once the rent is paid (0 here) XLA alone is prepared in
    # the background, timed TIMED_RUNS turns against NumPy, and the
    # program is final on the faster; the graph runtime is never built.
    monkeypatch.setenv(engine_choice.ENV, "auto")
    monkeypatch.setattr(tiered_runner, "HOT_SECONDS", 1e-9)
    monkeypatch.setattr(tiered_runner, "RENT_FACTOR", 0.0)
    monkeypatch.setattr(tiered_runner.host_threads, "_cap", 2)
    monkeypatch.setattr(tiered_runner.host_threads, "background_priority", lambda: None)
    monkeypatch.setattr(tiered_runner.engine_prediction, "predicted_gains",
                        lambda graph: (0.0, None))
    graph_built = _threads_building_graph_programs(monkeypatch)
    exe = compile_graph(_graph())
    x, w = f32(8, 6), f32(6, 5)
    want = exe.run_unchecked([x, w])
    outs = [exe.run(x, w)]  # NumPy: hot after it
    runner = exe._engine_run
    outs.append(exe.run(x, w))  # finds it hot: a trial, its rent to pay
    assert runner.engine == "trial" and runner.candidates == ("xla",)
    outs.append(exe.run(x, w))  # the rent paid: the compile starts
    _wait_for(runner, "timing")
    assert runner.candidate.engine == "xla"
    ran = []
    for _ in range(tiered_runner.WARM_UP_RUNS + 2 * tiered_runner.TIMED_RUNS):
        outs.append(exe.run(x, w))
        ran.append(engine_choice.current_engine(exe))
    assert ran == (["xla"] * tiered_runner.WARM_UP_RUNS
                   + ["numpy", "xla"] * tiered_runner.TIMED_RUNS)
    runner.thread.join(timeout=120)
    assert runner.engine == "final" and graph_built == []
    outs.append(exe.run(x, w))
    assert engine_choice.current_engine(exe) == runner.current_name in ("numpy", "xla")
    whats = [what for _, what in runner.events]
    assert whats[0].startswith("hot: a timed trial of xla after 0.0 s")
    assert whats[1].startswith("hot: preparing TensorFlow's engines (xla")
    assert any(what.startswith("xla ready") for what in whats)
    assert whats[-2].startswith(f"keeps {runner.current_name} (xla ")
    assert whats[-1] == f"final: {runner.current_name}"
    for out in outs:
        for g, wv in zip(out, want):
            np.testing.assert_allclose(g, wv, rtol=1e-5, atol=1e-6)


class _Candidate:
    """A candidate whose runs return their inputs, noting each hold."""

    def __init__(self, engine):
        self.engine = engine
        self.holds = []

    def run(self, arrays):
        return arrays

    def hold(self, arrays, indices):
        self.holds.append(indices)


def test_auto_keeps_the_faster_by_the_timed_runs():
    # The choice itself, with the times given: a candidate faster than the
    # engine so far is kept, a slower one dropped.
    runner = tiered_runner.TieredRunner(compile_graph(_graph()))

    class Candidate:
        def __init__(self, engine):
            self.engine = engine

        def run(self, arrays):
            return arrays

    # The engine so far's times of each phase against the candidate's.
    for engine, so_far, times, kept in [
            ("tensorflow", [0.004, 0.003, 0.005], [0.004, 0.002, 0.0025], "tensorflow"),
            ("xla", [0.002, 0.0025, 0.003], [0.0021, 0.003, 0.0022], "tensorflow")]:
        candidate = Candidate(engine)
        runner.candidate, runner.candidate_times, runner.engine = candidate, list(times), "timing"
        runner.current_times = list(so_far)
        runner.timed.clear()
        runner._keep_the_faster()
        assert runner.current_name == kept and runner.engine == "compiling"
        assert runner.timed.is_set() and runner.candidate is None
        assert runner.current_times == runner.candidate_times == []
        if engine == kept:
            assert runner.current == candidate.run


@pytest.mark.parametrize("warm_up", [0, 2])
def test_timed_runs_follow_the_warm_up_alternate_and_a_numpy_turn_copies_read_only_state_untimed(
        warm_up):
    exe = compile_graph(_graph())
    x, w = f32(8, 6), f32(6, 5)
    want = exe.run_unchecked([x, w])
    runner = tiered_runner.TieredRunner(exe)
    copied = []
    runner.writable = lambda arrays: copied.append(len(arrays))

    class Candidate(_Candidate):
        def run(self, arrays):
            return exe.run_unchecked(list(arrays))

    candidate = Candidate("tensorflow")
    runner.held = (1,)
    runner.candidate, runner.warm_up, runner.engine = candidate, warm_up, "timing"
    runner.timed.clear()
    ran, phase = [], []
    for _ in range(warm_up + 2 * tiered_runner.TIMED_RUNS):
        got = runner([x, w])
        ran.append(runner.last_engine)
        phase.append((len(runner.current_times), len(runner.candidate_times)))
        for g, wv in zip(got, want):
            np.testing.assert_array_equal(g, wv)
    assert ran == ["tensorflow"] * warm_up + ["numpy", "tensorflow"] * tiered_runner.TIMED_RUNS
    # The warm-up runs are not timed; each timed turn is.
    assert phase[:warm_up] == [(0, 0)] * warm_up
    assert phase[warm_up:warm_up + 2] == [(1, 0), (1, 1)]
    assert len(copied) == tiered_runner.TIMED_RUNS  # before each NumPy turn
    # And the candidate's state made its tensors before each of its turns.
    assert candidate.holds == [(1,)] * tiered_runner.TIMED_RUNS
    # Decided on the runs of this phase: both sides timed alike.
    assert runner.timed.is_set() and runner.engine == "compiling"
    assert runner.current_name in ("numpy", "tensorflow")


def test_the_next_candidate_waits_for_the_program_to_pay_its_rent(monkeypatch):
    # Rent-or-buy candidate by candidate: the compile thread waits until
    # the program has run the rent's CPU seconds more.
    runner = tiered_runner.TieredRunner(compile_graph(_graph()))
    done = threading.Event()
    runner.program_seconds = 3.0  # before the rest: not counted

    thread = threading.Thread(target=lambda: (runner._pay_rent(0.2), done.set()), daemon=True)
    thread.start()
    _wait_until(lambda: runner.events)
    assert "rests until the program has run 0.20 s" in runner.events[-1][1]
    assert not done.wait(0.3)
    runner.program_seconds += 0.1
    assert not done.wait(0.3)
    runner.program_seconds += 0.1 + 1e-3
    assert done.wait(10)
    runner.abandoned.set()


def test_xla_is_bought_once_its_expected_saving_would_have_paid_for_it(monkeypatch):
    # XLA after the graph runtime: its price is estimated from the graph
    # runtime's preparation, and only the fraction of the step it is
    # expected to save counts as rent; after any other candidate (or in
    # another order) the preparations so far, as if it saved the whole step.
    monkeypatch.setattr(tiered_runner, "RENT_FACTOR", 1.0)
    monkeypatch.setattr(tiered_runner, "XLA_PREPARATION_RATIO", 4.0)
    monkeypatch.setattr(tiered_runner, "XLA_EXPECTED_GAIN", 0.25)
    rent = tiered_runner.TieredRunner(compile_graph(_graph()))._rent  # no XLA prediction priced
    assert rent("xla", "tensorflow", 0.5) == pytest.approx(8.0)
    assert rent("xla", "tensorflow", 1.0) == pytest.approx(16.0)
    monkeypatch.setattr(tiered_runner, "XLA_EXPECTED_GAIN", 0.5)
    assert rent("xla", "tensorflow", 1.0) == pytest.approx(8.0)

    got = []

    def compile_thread():
        end = time.thread_time() + 0.05
        while time.thread_time() < end:  # stands for the import and the traces
            pass
        got.append((time.thread_time(), rent("tensorflow", "xla", 10.0)))

    thread = threading.Thread(target=compile_thread)
    thread.start()
    thread.join()
    spent, paid = got[0]
    assert spent <= paid < 1.0  # this thread's CPU, not the 10 s given
    monkeypatch.setattr(tiered_runner, "RENT_FACTOR", 0.0)
    assert rent("xla", "tensorflow", 1.0) == 0.0


def _wait_until(condition):
    deadline = time.monotonic() + 30
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert condition()


@pytest.mark.parametrize("cls", [engines.GraphProgram, engines.XlaProgram])
def test_results_given_back_run_as_their_tensors_without_a_copy(cls):
    # Held state: a run's results are the next run's inputs. They go back
    # as the tensors they view (a tensor made from an array is a copy),
    # and what a view holds when given back is what the run reads.
    exe = compile_graph(build([aval((4, 3)), aval((4, 3))],
                              lambda b, x, y: [b.op("mul", x, y), b.op("add", x, y)]))
    program = cls(exe)
    x, y = f32(4, 3), f32(4, 3)
    first = program.run([x, y])
    held = program._tensors_for(first)
    for view, tensor in zip(first, held):
        assert np.shares_memory(tensor._numpy(), view)
    fresh = program._tensors_for([np.array(first[0])])[0]
    assert fresh is not held[0] and not np.shares_memory(fresh._numpy(), first[0])
    first[0] += 1.0  # as a NumPy run writes donated state
    want = exe.run_unchecked([np.array(first[0]), np.array(first[1])])
    second = program.run(first)
    for k in range(2):
        np.testing.assert_array_equal(second[k], want[k])
    # An entry goes with its view: the tensor does not outlive the state.
    assert len(program._viewed) == 2
    del second
    assert program._viewed == {}


@pytest.mark.parametrize("cls", [engines.GraphProgram, engines.XlaProgram])
def test_held_state_is_made_tensors_before_a_run_and_the_run_reads_them(cls):
    # Before a candidate's timed turn after NumPy's, untimed: the arrays at
    # the indices given become views of tensors the run then takes as they
    # are (nothing made in the timed run), zero-size ones too; a 0-d one, whose
    # tensor's view is a NumPy scalar, stays; another index is not touched.
    def body(b, x, y, e, s):
        return [b.op("mul", x, y), b.op("add", e, e), b.op("add", s, s)]

    exe = compile_graph(build([aval((4, 3)), aval((4, 3)), aval((0, 3)), aval(())], body))
    program = cls(exe)
    arrays = [f32(4, 3), f32(4, 3), np.zeros((0, 3), np.float32), np.array(2.0, np.float32)]
    given = list(arrays)
    want = exe.run_unchecked([np.array(a) for a in arrays])
    program.hold(arrays, (0, 2, 3))
    assert arrays[1] is given[1] and arrays[3] is given[3]
    for k in (0, 2):
        assert arrays[k] is not given[k]  # (a copy, or an aligned array's buffer)
        np.testing.assert_array_equal(arrays[k], given[k])
        assert program._tensors_for(arrays)[k] is program._viewed[id(arrays[k])][1]
    again = list(arrays)
    program.hold(arrays, (0, 2, 3))  # held already: nothing copied
    assert all(a is b for a, b in zip(arrays, again))
    for g, wv in zip(program.run(arrays), want):
        np.testing.assert_array_equal(g, wv)


@pytest.mark.parametrize("warm_up", [1, 0])
def test_a_candidate_failing_in_a_timed_run_is_dropped(monkeypatch, caplog, warm_up):
    # In a warm-up run (1) or in its first timed turn, after NumPy's (0).
    monkeypatch.setattr(engines, "_noted", set())
    exe = compile_graph(_graph())
    x, w = f32(8, 6), f32(6, 5)
    want = exe.run_unchecked([x, w])
    runner = tiered_runner.TieredRunner(exe)

    class Refusing(engines.GraphProgram):
        def __init__(self):
            self.name = "refusing"

        def run(self, arrays):
            raise RuntimeError("kernel refused (test)")

    runner.candidate, runner.warm_up, runner.engine = Refusing(), warm_up, "timing"
    with caplog.at_level("DEBUG", logger="keras_ipu.device"):
        got = runner([x, w])
        if not warm_up:
            assert runner.current_times and not runner.timed.is_set()
            got = runner([x, w])
    for g, wv in zip(got, want):
        np.testing.assert_array_equal(g, wv)
    assert runner.engine == "compiling" and runner.timed.is_set() and runner.candidate is None
    assert runner.current_name == "numpy" and runner.last_engine == "numpy"
    assert any("kernel refused (test)" in r.message for r in caplog.records)


def _one_thread_runner(monkeypatch, rent=0.0, min_gain=float("-inf")):
    """A TieredRunner of _graph() on one host thread, hot at once, with
    `rent` (None: one_thread_rent's) and MIN_PREDICTED_GAIN `min_gain`;
    GraphProgram.build notes the thread it ran in: (runner, the threads,
    inputs, NumPy's results of them)."""
    monkeypatch.setenv(engine_choice.ENV, "auto")
    monkeypatch.setattr(tiered_runner, "HOT_SECONDS", 0.0)
    if rent is not None:
        monkeypatch.setattr(tiered_runner, "one_thread_rent", lambda: rent)
    monkeypatch.setattr(tiered_runner, "MIN_PREDICTED_GAIN", min_gain)
    monkeypatch.setattr(tiered_runner.host_threads, "_cap", 1)
    built_in = _threads_building_graph_programs(monkeypatch)
    exe = compile_graph(_graph())
    arrays = [f32(8, 6), f32(6, 5)]
    return tiered_runner.TieredRunner(exe), built_in, arrays, exe.run_unchecked(list(arrays))


def test_auto_on_one_host_thread_prepares_the_graph_runtime_in_the_programs_run(monkeypatch,
                                                                                caplog):
    # No background (it would take the program's own core): a run of the
    # program prepares the graph runtime in its thread and returns its
    # results; the runs after time it against NumPy, then it is final.
    runner, built_in, (x, w), want = _one_thread_runner(monkeypatch)
    outs = [runner([x, w])]  # NumPy: hot after it
    assert runner.last_engine == "numpy" and runner.engine == "foreground"
    with caplog.at_level("INFO", logger="keras_ipu.device"):
        outs.append(runner([x, w]))  # prepares, and says so (INFO: quiet by default)
    assert [r.levelname for r in caplog.records if "in this thread" in r.message] == ["INFO"]
    assert built_in == [threading.main_thread()] and runner.thread is None
    assert runner.last_engine == "tensorflow" and runner.engine == "timing"
    ran = []
    for _ in range(tiered_runner.WARM_UP_RUNS + 2 * tiered_runner.TIMED_RUNS):
        outs.append(runner([x, w]))
        ran.append(runner.last_engine)
    assert ran == ["tensorflow"] * tiered_runner.WARM_UP_RUNS + ["numpy", "tensorflow"] * tiered_runner.TIMED_RUNS
    assert runner.engine == "final" and runner.candidate is None
    outs.append(runner([x, w]))
    assert runner.last_engine == runner.current_name in ("numpy", "tensorflow")
    assert built_in == [threading.main_thread()] and runner.thread is None
    whats = [what for _, what in runner.events]
    assert whats[0].startswith("hot: one host thread")
    assert whats[1].startswith("one host thread: preparing tensorflow")
    assert whats[2].startswith("tensorflow ready") and whats[-1].startswith("keeps ")
    for out in outs:
        for g, wv in zip(out, want):
            np.testing.assert_allclose(g, wv, rtol=1e-5, atol=1e-6)


def test_auto_on_one_host_thread_waits_for_the_programs_rent(monkeypatch):
    # Hot and predicted to pay, but the stall is bought only once the
    # program has run its rent of CPU (one_thread_rent): until then NumPy.
    runner, built_in, (x, w), want = _one_thread_runner(monkeypatch, rent=3600.0)
    for _ in range(3):
        got = runner([x, w])
    assert runner.engine == "foreground" and runner.last_engine == "numpy"
    assert built_in == [] and runner.thread is None
    runner.program_seconds = 3600.0
    runner([x, w])
    assert built_in == [threading.main_thread()] and runner.last_engine == "tensorflow"
    for g, wv in zip(got, want):
        np.testing.assert_array_equal(g, wv)


def test_auto_on_one_host_thread_rents_the_stall_ahead(monkeypatch):
    # TensorFlow imported already (by this file; a user's tf.data pipeline,
    # Keras' set_random_seed): the stall ahead is the trace and the first
    # run, not the import, and so is the rent.
    gain = tiered_runner.ONE_THREAD_EXPECTED_GAIN
    traced = tiered_runner.ONE_THREAD_TRACE_SECONDS / gain
    assert tiered_runner.one_thread_rent({}) == pytest.approx(
        traced + tiered_runner.ONE_THREAD_IMPORT_SECONDS / gain)
    assert "tensorflow" in sys.modules
    runner, built_in, (x, w), want = _one_thread_runner(monkeypatch, rent=None)
    runner([x, w])  # NumPy: hot after it
    assert runner.engine == "foreground" and runner.foreground_rent == pytest.approx(traced)
    runner.program_seconds = 0.99 * traced
    runner([x, w])
    assert built_in == [] and runner.last_engine == "numpy"
    runner.program_seconds = traced
    got = runner([x, w])
    assert built_in == [threading.main_thread()] and runner.last_engine == "tensorflow"
    for g, wv in zip(got, want):
        np.testing.assert_array_equal(g, wv)


@pytest.mark.parametrize("graph_gain, xla_gain, event", [
    # Predicted to pay on neither engine.
    (0.0, 0.0, "hot: stays on numpy"),
    (0.0, None, "hot: stays on numpy"),
    # XLA not predicted to pay (its ratios answer on this host class), the
    # graph runtime without an answer of XLA's: neither is prepared.
    (0.0, 0.04, "hot: stays on numpy"),
])
def test_auto_on_one_host_thread_keeps_numpy_where_neither_engine_is_predicted_to_pay(
        monkeypatch, graph_gain, xla_gain, event):
    runner, built_in, (x, w), want = _one_thread_runner(monkeypatch, min_gain=0.05)
    monkeypatch.setattr(tiered_runner.engine_prediction, "predicted_gains",
                        lambda graph: (graph_gain, xla_gain))
    for _ in range(3):
        got = runner([x, w])
    assert runner.engine == "final" and runner.current_name == runner.last_engine == "numpy"
    assert built_in == [] and runner.thread is None
    assert any(what.startswith(event) for _, what in runner.events)
    for g, wv in zip(got, want):
        np.testing.assert_array_equal(g, wv)


def test_auto_on_one_host_thread_prepares_xla_where_only_xla_is_predicted_to_pay(monkeypatch):
    # The LSTM on our own AVX-512 gemm: the graph runtime at a tie, XLA
    # predicted to save 15%. XLA is prepared in the program's run once the
    # program has run the stall ahead (its compile, XLA_PREPARATION_RATIO
    # times the graph runtime's trace) over that gain; the graph runtime
    # is never built.
    runner, built_in, (x, w), want = _one_thread_runner(monkeypatch, rent=None, min_gain=0.05)
    monkeypatch.setattr(tiered_runner.engine_prediction, "predicted_gains",
                        lambda graph: (0.0, 0.15))
    built = _threads_building_graph_programs(monkeypatch, engines.XlaProgram)
    runner([x, w])  # NumPy: hot after it
    assert runner.engine == "foreground" and runner.foreground_name == "xla"
    assert "tensorflow" in sys.modules  # imported by this file: no import in the stall
    compile_stall = tiered_runner.ONE_THREAD_TRACE_SECONDS * tiered_runner.XLA_PREPARATION_RATIO
    assert runner.foreground_rent == pytest.approx(compile_stall / 0.15)
    assert runner.foreground_rent == pytest.approx(tiered_runner.one_thread_rent(
        name="xla", gain=0.15))
    runner.program_seconds = 0.99 * runner.foreground_rent
    runner([x, w])
    assert built == [] and runner.last_engine == "numpy"
    runner.program_seconds = runner.foreground_rent
    got = runner([x, w])
    assert built == [threading.main_thread()] and built_in == [] and runner.thread is None
    assert runner.last_engine == "xla" and runner.engine == "timing"
    for g, wv in zip(got, want):
        np.testing.assert_allclose(g, wv, rtol=1e-5, atol=1e-6)
    whats = [what for _, what in runner.events]
    assert whats[0].startswith("hot: one host thread, xla prepared after")
    assert whats[1].startswith("one host thread: preparing xla")


@pytest.mark.parametrize("where", ["foreground", "background"])
def test_auto_stays_on_numpy_where_tensorflow_cannot_be_imported(monkeypatch, caplog, where):
    # One host thread imports it in the program's run, more in the compile
    # thread; either way one debug note, and NumPy for good.
    runner, built_in, (x, w), want = _one_thread_runner(monkeypatch)
    monkeypatch.setattr(engines, "_noted", set())

    def no_tensorflow(*args):
        raise ImportError("No module named 'tensorflow' (test)")

    monkeypatch.setattr(tensorflow_runtime, "import_tensorflow", no_tensorflow)
    monkeypatch.setattr(tensorflow_runtime, "tensorflow_ready", no_tensorflow)
    with caplog.at_level("DEBUG", logger="keras_ipu.device"):
        got = runner([x, w])  # hot after it
        if where == "foreground":
            got = runner([x, w])
        else:
            runner.engine = "compiling"
            runner._compile_stoppably(sample=None)
        for _ in range(3):
            got = runner([x, w])
    assert runner.engine == "final" and runner.current_name == runner.last_engine == "numpy"
    assert built_in == []
    notes = [r for r in caplog.records if "could not be imported" in r.message]
    assert [r.levelname for r in notes] == ["DEBUG"] and "runs on NumPy" in notes[0].message
    for g, wv in zip(got, want):
        np.testing.assert_array_equal(g, wv)


def test_numpy_copies_read_only_donated_inputs(monkeypatch):
    # XLA's results are read-only; a NumPy program donated them (this one
    # after the tiered switch, or another) writes into a copy.
    exe = compile_graph(_graph())
    exe.written_inputs = frozenset({0})
    x = f32(8, 6)
    x.setflags(write=False)
    for run in (tiered_runner.TieredRunner(exe).current, engines.numpy_runner(exe)):
        arrays = [x, f32(6, 5)]
        run(arrays)
        assert arrays[0] is not x and arrays[0].flags.writeable
        np.testing.assert_array_equal(arrays[0], x)


def test_fp_behaviour_and_setting_numpy_keep_numpy(monkeypatch):
    exe = compile_graph(_graph())
    monkeypatch.setenv(engine_choice.ENV, "numpy")
    assert engine_choice.runner(exe) == exe.run_unchecked
    exe.fp_behaviour = FPBehaviour(esr="ON")
    for setting in ("xla", "tensorflow", "auto"):
        monkeypatch.setenv(engine_choice.ENV, setting)
        assert engine_choice.runner(exe) == exe.run_unchecked


def test_unknown_engine_is_a_clear_error(monkeypatch):
    monkeypatch.setenv(engine_choice.ENV, "gpu")
    with pytest.raises(ValueError, match=r"KERAS_IPU_ENGINE='gpu'.*auto, numpy, tensorflow, xla"):
        engine_choice.engine_setting()


@pytest.mark.parametrize("setting", ["xla", "tensorflow"])
def test_a_primitive_without_a_rule_runs_on_numpy(setting, monkeypatch, caplog):
    monkeypatch.setenv(engine_choice.ENV, setting)
    graph = one("svd", [((3, 3), "float32")], full_matrices=False, compute_uv=False)
    exe = compile_graph(graph)
    x = f32(3, 3)
    with caplog.at_level("DEBUG", logger="keras_ipu.device"):
        out = exe.run(x)
    np.testing.assert_allclose(out[0], np.linalg.svd(x, compute_uv=False), rtol=1e-5)
    assert engine_choice.current_engine(exe) == "numpy"
    assert [r.levelname for r in caplog.records if "svd" in r.message] == ["DEBUG"]


def _failing(cls):
    class Failing(cls):
        """Emits fine, fails in its first run (XLA's compile, or a
        TensorFlow kernel refusing the program)."""

        def __init__(self, executable, check=None):
            self.name = "failing"
            self._fast = None

        def run(self, arrays):
            raise RuntimeError("compile failed (test)")

    return classmethod(lambda _, exe, check=None: Failing(exe))


@pytest.mark.parametrize("setting", ["xla", "tensorflow", "auto"])
def test_a_failing_compile_falls_back_to_numpy_silently(monkeypatch, caplog, setting):
    monkeypatch.setenv(engine_choice.ENV, setting)
    monkeypatch.delenv(engines.STRICT_ENV, raising=False)
    monkeypatch.setattr(tiered_runner, "HOT_SECONDS", 0.0)
    monkeypatch.setattr(tiered_runner, "MIN_PREDICTED_GAIN", float("-inf"))
    monkeypatch.setattr(engines, "_noted", set())
    monkeypatch.setattr(tiered_runner.host_threads, "_cap", 2)
    for cls in engines.PROGRAMS.values():
        monkeypatch.setattr(cls, "build", _failing(cls))
    exe = compile_graph(_graph())
    x, w = f32(8, 6), f32(6, 5)
    want = exe.run_unchecked([x, w])
    with caplog.at_level("DEBUG", logger="keras_ipu.device"):
        results = [exe.run(x, w) for _ in range(3)]
        runner = exe._engine_run
        if isinstance(runner, tiered_runner.TieredRunner):
            # The program keeps running: the graph runtime is prepared by
            # one of its runs (CALLER_PREPARES), whenever the niced import
            # is done, which a busy machine delays past the runs above.
            deadline = time.monotonic() + 120
            while runner.engine != "final" and time.monotonic() < deadline:
                results.append(exe.run(x, w))
                time.sleep(0.01)
            runner.thread.join(timeout=60)
            assert runner.engine == "final" and runner.current_name == "numpy"
        results += [exe.run(x, w) for _ in range(3)]
    for outs in results:
        for g, wv in zip(outs, want):
            np.testing.assert_array_equal(g, wv)
    assert engine_choice.current_engine(exe) == "numpy"
    failures = [r for r in caplog.records if "compile failed (test)" in r.message]
    assert failures and {r.levelname for r in failures} == {"DEBUG"}
    if setting == "auto":  # each candidate tried, each failure noted once
        assert {r.message.split(":")[0] for r in failures} == {
            "failing does not run on tensorflow", "failing does not run on xla"}


# -- the process's exit never waits for a background compile ---------------

_EXIT_PROGRAM = """
import atexit, sys, time
sys.path.insert(0, {tests!r})
import numpy as np
from compiler_graphs import aval, build
from keras_ipu.device.compiler import compile_graph, engines, tensorflow_runtime, tiered_runner

phase = sys.argv[1]


class Slow(engines.XlaProgram):
    # A compile of ten minutes: in its trace (Python, one node after
    # another) or in XLA's compiler (native code, the GIL released).
    def __init__(self, executable, check=None):
        self.name = "slow"
        self._fast = None
        while phase == "trace":
            check()
            time.sleep(0.01)

    def run(self, arrays):
        time.sleep(600)
        raise AssertionError("an abandoned compile ran on")


tiered_runner.HOT_SECONDS = 0.0
tiered_runner.MIN_PREDICTED_GAIN = float("-inf")
tiered_runner.host_threads._cap = 2
tiered_runner.AUTO_CANDIDATES = ("xla",)
engines.XlaProgram.build = classmethod(lambda cls, exe, check=None: Slow(exe, check))
# The slow compile stands for TensorFlow too: no import, no runtime start.
tensorflow_runtime.tensorflow_ready = lambda graph, modes, check: None
exe = compile_graph(build([aval((4, 3))], lambda b, x: b.op("exp", x)))
x = np.ones((4, 3), np.float32)
exe.run(x)
exe.run(x)
assert exe._engine_run.engine == "compiling", exe._engine_run.engine
time.sleep(0.3)
atexit.register(print, "atexit handlers ran", flush=True)
print("main done", flush=True)
sys.exit(3)
"""


@pytest.mark.parametrize("phase", ["trace", "native"])
def test_exit_does_not_wait_for_a_background_compile(phase):
    tests = os.path.dirname(os.path.abspath(__file__))
    code = _EXIT_PROGRAM.format(tests=tests)
    env = dict(os.environ, KERAS_IPU_ENGINE="auto")
    out = subprocess.run([sys.executable, "-c", code, phase], env=env,
                         capture_output=True, text=True, timeout=120)
    # Before: the interpreter joined the compile thread (ten minutes here).
    assert out.returncode == 3, out.stderr[-3000:]
    assert out.stdout.split() == "main done atexit handlers ran".split(), out



_EXIT_IN_TENSORFLOWS_IMPORT = """
import atexit, sys, time
sys.path.insert(0, {tests!r})
import numpy as np
from compiler_graphs import aval, build
from keras_ipu.device.compiler import compile_graph, tiered_runner

assert "tensorflow" not in sys.modules
tiered_runner.HOT_SECONDS = 0.0
tiered_runner.MIN_PREDICTED_GAIN = float("-inf")
tiered_runner.host_threads._cap = 2
# Waited for below, and the exit waits for it to stop at its next module:
# at nice 19 beside other work it would crawl (114 s of the 120 at load 8).
tiered_runner.host_threads.background_priority = lambda: None
exe = compile_graph(build([aval((4, 3))], lambda b, x: b.op("exp", x)))
x = np.ones((4, 3), np.float32)
exe.run(x)
exe.run(x)  # starts the compile: its thread imports TensorFlow
while "tensorflow" not in sys.modules:
    time.sleep(0.001)
atexit.register(print, "atexit handlers ran", flush=True)
print("main done", flush=True)
sys.exit(3)
"""


def test_exit_during_the_background_compiles_import_of_tensorflow():
    # A short script on a busy machine: the niced compile thread is still
    # importing TensorFlow when the script ends. Before: the exit waited
    # for the import, which then failed ("can't register atexit after
    # shutdown", a traceback on stderr), and tearing down the partly
    # imported TensorFlow crashed the process (SIGSEGV) when the thread
    # had ended before the exit's last check.
    tests = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, KERAS_IPU_ENGINE="auto")
    out = subprocess.run([sys.executable, "-c", _EXIT_IN_TENSORFLOWS_IMPORT.format(tests=tests)],
                         env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 3, out.stderr[-3000:]
    assert out.stdout.split() == "main done atexit handlers ran".split(), out
    assert "Exception in thread" not in out.stderr, out.stderr[-3000:]
    assert "Traceback" not in out.stderr, out.stderr[-3000:]


_PRIORITIES = textwrap.dedent(
    """
    import os, sys, threading, time
    import numpy as np
    sys.path.insert(0, {here!r})
    from compiler_graphs import aval, build
    from keras_ipu.device.compiler import compile_graph, tensorflow_runtime, tiered_runner

    def nices():
        out = {{}}
        for tid in os.listdir("/proc/self/task"):
            try:  # a thread that ended since the listing has no stat left
                with open(f"/proc/self/task/{{tid}}/stat") as f:
                    stat = f.read().rsplit(")", 1)[1].split()
            except (FileNotFoundError, ProcessLookupError):
                continue
            out[int(tid)] = int(stat[16])
        return out

    def cpu_ns(tids):
        out = {{}}
        for tid in tids:
            try:
                with open(f"/proc/self/task/{{tid}}/schedstat") as f:
                    out[tid] = int(f.read().split()[0])
            except (FileNotFoundError, ProcessLookupError):
                out[tid] = 0
        return out

    def wait_while(engine, engines_done=()):
        # A hang guard (10 min): the niced compile gets only the CPU
        # nobody else wants (115 s in all at load 8).
        for _ in range(60000):
            if runner.engine != engine or not runner.thread.is_alive():
                return
            time.sleep(0.01)

    tiered_runner.HOT_SECONDS = 0.0
    tiered_runner.MIN_PREDICTED_GAIN = float("-inf")
    tiered_runner.RENT_FACTOR = 0.0
    tiered_runner.host_threads._cap = 2
    # Imported here, at normal priority: at nice 19 on a busy machine the
    # import would crawl. TensorFlow's runtime is not started by importing.
    import tensorflow
    seen = {{}}

    class Noting(threading.Event):
        def set(self):
            seen["compile thread"] = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
            seen["threads at import"] = set(nices())
            super().set()

    tensorflow_runtime._tf_imported = Noting()
    # Large enough that XLA runs it on its intra-op pool.
    exe = compile_graph(build([aval((1024, 1024))], lambda b, x: [b.op("tanh", x)]))
    x = np.ones((1024, 1024), np.float32)
    exe.run(x)
    exe.run(x)  # starts the compile
    runner = exe._engine_run
    wait_while("compiling")  # the next run prepares the graph program
    assert runner.engine == "preparing", runner.engine
    exe.run(x)
    wait_while("compiling")  # handed over for timing
    assert runner.engine == "timing" and runner.candidate.engine == "tensorflow"
    runtime = {{t: n for t, n in nices().items() if t not in seen["threads at import"]}}
    for _ in range(tiered_runner.WARM_UP_RUNS + 2 * tiered_runner.TIMED_RUNS):  # in turn with NumPy's
        exe.run(x)
    wait_while("compiling")  # XLA's compile, then its first run
    assert runner.engine == "timing" and runner.candidate.engine == "xla", runner.engine
    xla_compile = {{t: n for t, n in nices().items()
                   if t not in seen["threads at import"] and t not in runtime}}
    # The XLA program's runs (this thread and TensorFlow's pools) take no
    # CPU in a niced thread but the compile thread waiting for them.
    compile_tid = runner.thread.native_id
    tids = [t for t in nices() if t != compile_tid]
    niced = [t for t, n in nices().items() if n == 19 and t != compile_tid]
    before = cpu_ns(tids)
    for _ in range(2 * tiered_runner.TIMED_RUNS):
        exe.run(x)
    after = cpu_ns(tids)
    print(os.getpriority(os.PRIO_PROCESS, 0), seen["compile thread"], len(runtime),
          sorted(set(runtime.values())), len(xla_compile), sorted(set(xla_compile.values())),
          sum(after[t] - before[t] for t in niced), sum(after[t] - before[t] for t in tids))
    """
)


def test_the_background_compile_runs_at_low_priority_and_tensorflows_runtime_not():
    # The compile takes only CPU nobody else wants, XLA's compile pool
    # included (it starts at the first compile, from the niced thread);
    # TensorFlow's run-time pools, started by a thread at normal priority,
    # are not niced (threads inherit their starter's nice, and a user
    # cannot lower it again), and the programs run on them.
    # The nice the tests run at (a verifier may run them niced), which the
    # process below inherits as its normal priority.
    started = os.getpriority(os.PRIO_PROCESS, 0)
    if started >= 19:
        pytest.skip("the tests run at nice 19: no lower priority to tell apart")
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, KERAS_BACKEND="ipu", KERAS_IPU_ENGINE="auto")
    out = subprocess.run([sys.executable, "-c", _PRIORITIES.format(here=here)], env=env,
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    (main, compile_thread, runtime, runtime_nices, xla, xla_nices,
     niced_cpu, runs_cpu) = out.stdout.strip().splitlines()[-1].split(" ")
    assert (int(main), int(compile_thread)) == (started, 19)
    assert int(runtime) > 0 and eval(runtime_nices) == [started]  # TensorFlow's runtime
    # Before: XLA's compile pool, started with the runtime, ran at nice 0.
    assert int(xla) > 0 and eval(xla_nices) == [19]
    # (A niced pool thread may be woken for a few microseconds.)
    assert int(niced_cpu) < 0.05 * int(runs_cpu), (niced_cpu, runs_cpu)


_RUNTIME_START_AT_EXIT = """
import sys, threading, time
from keras_ipu.device.compiler import tensorflow_runtime


began = threading.Event()


class FakeTensorFlow:
    # Stands for the runtime's start (TensorFlow's C++, a second or two):
    # a daemon thread still in it when the interpreter finalizes aborts the
    # process when it returns.
    @staticmethod
    def add(x, y):
        began.set()
        time.sleep(1.0)
        print("runtime started", flush=True)

    @staticmethod
    def constant(x):
        return x


tensorflow_runtime.import_tensorflow = lambda: FakeTensorFlow
finished = threading.Thread(target=lambda: None)
finished.start()
finished.join()
class Runner:  # a compile that has ended
    abandoned, unstoppable, thread = threading.Event(), threading.Event(), finished


runner = Runner()
runner.unstoppable.set()
tensorflow_runtime.in_flight_add(runner)
tensorflow_runtime.start_runtime_starter()
tensorflow_runtime._tf_imported.set()
began.wait(60)  # the start in progress, however late a busy machine runs the thread
print("main done", flush=True)
sys.exit(3)
"""


def test_exit_waits_for_tensorflows_runtime_start_in_progress():
    out = subprocess.run([sys.executable, "-c", _RUNTIME_START_AT_EXIT],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 3, out.stderr[-3000:]
    # Before: the exit went on under the start (an abort when it was C++).
    assert out.stdout.split() == "main done runtime started".split(), out
