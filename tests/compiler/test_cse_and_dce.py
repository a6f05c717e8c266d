import numpy as np
from compiler_graphs import aval
from compiler_graphs import build
from compiler_graphs import lit
from compiler_graphs import prim_names
from compiler_graphs import run

from keras_ipu.device.compiler.common_subexpressions import (
    eliminate_common_subexpressions,
)
from keras_ipu.device.compiler.dead_code import eliminate_dead_code
from keras_ipu.device.compiler.graph_utils import freeze


def test_cse_merges_equal_nodes_and_rewires_readers():
    def body(b, x):
        e1 = b.op("exp", x)
        e2 = b.op("exp", x)
        s1 = b.op("reduce_sum", e1, axes=(0,))
        s2 = b.op("reduce_sum", e2, axes=(0,))
        return b.op("add", s1, s2)

    g = build([aval((3,))], body)
    out = eliminate_common_subexpressions(g)
    assert prim_names(out) == ["exp", "reduce_sum", "add"]
    add = out.nodes[-1]
    assert add.inputs[0] is add.inputs[1]
    x = np.array([0.0, 1.0, 2.0], np.float32)
    np.testing.assert_allclose(run(out, x)[0], 2 * np.exp(x).sum(), rtol=1e-6)


def test_cse_keeps_nodes_with_different_params_or_operands():
    def body(b, x, y):
        return [
            b.op("reduce_sum", x, axes=(0,)),
            b.op("reduce_sum", x, axes=(1,)),
            b.op("add", x, y),
            b.op("add", y, x),
            b.op("add", x, lit(np.full((2, 2), 0.0, np.float32))),
            b.op("add", x, lit(np.full((2, 2), -0.0, np.float32))),
        ]

    g = build([aval((2, 2)), aval((2, 2))], body)
    assert len(eliminate_common_subexpressions(g).nodes) == 6


def test_cse_merges_equal_small_literals():
    def body(b, x):
        return [b.op("max", x, lit(0.0, "float32")), b.op("max", x, lit(0.0, "float32"))]

    g = build([aval((2,))], body)
    out = eliminate_common_subexpressions(g)
    assert prim_names(out) == ["max"]
    assert out.outputs[0] is out.outputs[1]


def test_param_keys_keep_types_and_float_signs():
    # 1, 1.0 and True are equal in Python but not interchangeable params.
    keys = {freeze(v) for v in (1, 1.0, True, 0.0, -0.0, (1,), [1])}
    assert len(keys) == 7
    assert freeze((1, np.dtype("float32"))) == freeze((1, np.dtype("float32")))


def test_cse_keeps_different_dtype_params():
    def body(b, x):
        return [
            b.op("convert_element_type", x, dtype=np.dtype("int32")),
            b.op("convert_element_type", x, dtype=np.dtype("float16")),
        ]

    g = build([aval((2,))], body)
    assert len(eliminate_common_subexpressions(g).nodes) == 2


def test_dce_drops_unused_nodes_only():
    def body(b, x):
        used = b.op("exp", x)
        b.op("log", x)  # dead
        dead2 = b.op("sin", x)
        b.op("neg", dead2)  # dead, and makes sin dead
        return b.op("add", used, x)

    g = build([aval((2,))], body)
    out = eliminate_dead_code(g)
    assert prim_names(g) == ["exp", "log", "sin", "neg", "add"]
    assert prim_names(out) == ["exp", "add"]
    x = np.array([1.0, 2.0], np.float32)
    np.testing.assert_allclose(run(out, x)[0], np.exp(x) + x, rtol=1e-6)


def test_dce_keeps_multi_output_node_when_one_output_is_used():
    def body(b, x):
        values, _ = b.op("top_k", x, k=1)
        return values

    g = build([aval((4,))], body)
    assert prim_names(eliminate_dead_code(g)) == ["top_k"]
