import warnings

import numpy as np
import pytest
from compiler_graphs import aval
from compiler_graphs import build
from compiler_graphs import lit
from compiler_graphs import run

from keras_ipu.device.compiler import StaticShapeError
from keras_ipu.device.compiler import compile_graph
from keras_ipu.device.compiler.demotion import DemotionWarning
from keras_ipu.device.compiler.demotion import demote_64bit
from keras_ipu.device.compiler.static_shapes import check_static_shapes
from keras_ipu.device.ir import Graph
from keras_ipu.device.ir import Node
from keras_ipu.device.ir import Var
from keras_ipu.device.primitives import REGISTRY


def test_static_graph_passes_unchanged():
    g = build([aval((2, 3))], lambda b, x: b.op("exp", x))
    assert check_static_shapes(g) is g


def test_none_dimension_is_an_error_naming_the_op():
    g = build([aval((2, 3))], lambda b, x: b.op("exp", x))
    g.nodes[0].outputs[0] = Var(aval((None, 3)))
    g.nodes[0].source = "dense_1"
    with pytest.raises(StaticShapeError, match=r"`exp` \(in Keras layer .dense_1.\).*f32\[\?,3\]"):
        check_static_shapes(g)


def test_none_input_dimension_is_an_error():
    g = build([aval((None, 3))], lambda b, x: b.op("exp", x))
    with pytest.raises(StaticShapeError, match=r"Input 0 .*f32\[\?,3\]"):
        check_static_shapes(g)


def test_dynamic_shape_primitive_is_an_error():
    g = Graph()
    x = Var(aval((5,)))
    g.inputs = [x]
    out = Var(aval((None,), "int32"))
    g.nodes = [Node(REGISTRY["nonzero"], [x], {}, [out])]
    g.outputs = [out]
    with pytest.raises(StaticShapeError, match="`nonzero`.*depends on its input values"):
        check_static_shapes(g)


def test_sub_graph_is_checked_too():
    body = build([aval((None,))], lambda b, x: b.op("neg", x))
    g = Graph()
    i = Var(aval((), "int32"))
    x = Var(aval((3,)))
    y = Var(aval((3,)))
    g.inputs = [i, x]
    g.nodes = [Node(REGISTRY["cond"], [i, x], {"branches": (body,)}, [y])]
    g.outputs = [y]
    with pytest.raises(StaticShapeError, match="`cond` sub-graph"):
        check_static_shapes(g)


def test_demotion_rewrites_inputs_literals_params_and_avals():
    def body(b, x, n):
        y = b.op("mul", x, lit(2.0, "float64"))
        z = b.op("convert_element_type", n, dtype=np.dtype("float64"))
        return [b.op("add", y, z), n]

    g = build([aval((3,), "float64"), aval((3,), "int64")], body)
    notes = []
    d = demote_64bit(g, notes)
    assert [v.aval.dtype.name for v in d.inputs] == ["float32", "int32"]
    assert [v.aval.dtype.name for v in d.outputs] == ["float32", "int32"]
    assert d.nodes[0].inputs[1].value.dtype == np.float32
    assert d.nodes[1].params["dtype"] == np.dtype("float32")
    assert notes  # something was recorded
    x = np.array([1.5, 2.0, 3.0], np.float32)
    n = np.array([1, 2, 3], np.int32)
    out, n_out = run(d, x, n)
    assert out.dtype == np.float32 and n_out.dtype == np.int32
    np.testing.assert_array_equal(out, 2 * x + n)


def test_demotion_leaves_32_bit_graphs_alone():
    g = build([aval((3,))], lambda b, x: b.op("exp", x))
    notes = []
    assert demote_64bit(g, notes) is g and notes == []


def test_demotion_recurses_into_scan_bodies():
    def step(b, c, x):
        s = b.op("add", c, x)
        return [s, s]

    body = build([aval((2,), "float64"), aval((2,), "float64")], step)
    g = build(
        [aval((2,), "float64"), aval((4, 2), "float64")],
        lambda b, c, xs: b.op("scan", c, xs, body=body, length=4, reverse=False,
                              n_carry=1, n_xs=1, unroll=1),
    )
    d = demote_64bit(g, [])
    sub = d.nodes[0].params["body"]
    assert [v.aval.dtype.name for v in sub.inputs] == ["float32", "float32"]
    with pytest.warns(DemotionWarning):
        exe = compile_graph(g)
    c = np.array([1.0, -1.0])
    xs = np.arange(8.0).reshape(4, 2)
    carry, ys = exe.run(c, xs)
    assert carry.dtype == ys.dtype == np.float32
    np.testing.assert_array_equal(ys, c + np.cumsum(xs, axis=0))
    np.testing.assert_array_equal(carry, ys[-1])


def test_compile_warns_once_for_many_demotions_and_runs_in_32_bits():
    def body(b, x):
        for _ in range(5):
            x = b.op("add", x, lit(1.0, "float64"))
        return b.op("exp", x)

    g = build([aval((3,), "float64")], body)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        exe = compile_graph(g)
    demotions = [w for w in caught if issubclass(w.category, DemotionWarning)]
    assert len(demotions) == 1
    assert "float64" in str(demotions[0].message)
    x = np.array([0.0, 0.5, 1.0])
    (out,) = exe.run(x)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, np.exp(x + 5), rtol=1e-6)


def test_no_warning_without_64_bit_values():
    g = build([aval((3,))], lambda b, x: b.op("exp", x))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        compile_graph(g)
