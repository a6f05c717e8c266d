import numpy as np
import pytest
from compiler_graphs import aval
from compiler_graphs import build
from compiler_graphs import lit
from compiler_graphs import prim_names
from compiler_graphs import run

from keras_ipu.device.compiler.constant_folding import fold_constants
from keras_ipu.device.ir import Literal


def test_literal_only_chain_folds_to_one_literal():
    def body(b, x):
        c = b.op("mul", lit(3.0, "float32"), lit(4.0, "float32"))
        d = b.op("add", c, lit(1.0, "float32"))
        return b.op("add", x, d)

    g = build([aval((3,))], body)
    folded = fold_constants(g)
    assert prim_names(g) == ["mul", "add", "add"]
    assert prim_names(folded) == ["add"]
    (node,) = folded.nodes
    assert isinstance(node.inputs[1], Literal)
    assert float(node.inputs[1].value) == 13.0
    x = np.arange(3, dtype=np.float32)
    np.testing.assert_array_equal(run(folded, x)[0], x + 13)


def test_folded_graph_output_becomes_literal():
    def body(b, x):
        return [x, b.op("iota", dtype=np.dtype("int32"), shape=(4,), dimension=0)]

    g = build([aval((2,))], body)
    folded = fold_constants(g)
    assert folded.nodes == []
    assert isinstance(folded.outputs[1], Literal)
    np.testing.assert_array_equal(folded.outputs[1].value, np.arange(4))


def test_size_cap_keeps_big_results_as_computations():
    def body(b, x):
        big = b.op("broadcast_to", lit(1.0, "float32"), shape=(1024, 1024))
        return b.op("add", x, big)

    g = build([aval((1024, 1024))], body)
    assert prim_names(fold_constants(g)) == ["broadcast_to", "add"]
    assert prim_names(fold_constants(g, limit_bytes=8 << 20)) == ["add"]


def test_random_and_value_operands_are_not_folded():
    key = lit(np.array([1, 2], np.uint32))

    def body(b, x):
        bits = b.op("random_bits", key, shape=(4,), bit_width=32)
        return [bits, b.op("neg", x)]

    g = build([aval((4,))], body)
    assert prim_names(fold_constants(g)) == ["random_bits", "neg"]


@pytest.mark.parametrize("dtype", ["float32", "int32"])
def test_folded_value_keeps_the_rule_dtype(dtype):
    g = build([], lambda b: b.op("add", lit(2, dtype), lit(3, dtype)))
    out = fold_constants(g).outputs[0]
    assert out.value.dtype == np.dtype(dtype) and out.value == 5
