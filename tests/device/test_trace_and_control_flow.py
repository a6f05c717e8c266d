"""The tracer's closure conversion, the graph interpreter and the control-flow
primitives (cond, while_loop, scan, stop_gradient, optimization_barrier,
remat, custom_vjp), checked against NumPy and hand-computed values."""

import numpy as np
import pytest

from keras_ipu.device.array import Tensor
from keras_ipu.device.interpreter import eval_graph
from keras_ipu.device.ir import ShapedArray
from keras_ipu.device.primitives import control_flow as cf
from keras_ipu.device.primitives import elementwise as ew
from keras_ipu.device.primitives.shape_rules import ShapeError
from keras_ipu.device.trace import GraphBuilder
from keras_ipu.device.trace import Tracer
from keras_ipu.device.trace import TracerConversionError
from keras_ipu.device.trace import trace_flat
from keras_ipu.device.trace import tracing

F32 = np.dtype("float32")
I32 = np.dtype("int32")


def aval(shape, dtype=F32):
    return ShapedArray(shape, dtype)


def host(x):
    return np.asarray(x)


# -- tracer: nesting and closures ---------------------------------------------


def test_inner_trace_captures_outer_tracers_as_extra_inputs():
    outer = GraphBuilder()
    x = outer.new_input(aval((None, 3)))
    with tracing(outer):
        y = ew.mul_p.bind(x, x)
        graph, captures = trace_flat(
            lambda t: [ew.add_p.bind(t, y), ew.sub_p.bind(x, t)], [aval((None, 3))]
        )
    # One explicit input, then y and x in the order they were first used.
    assert len(graph.inputs) == 3
    assert [c.var for c in captures] == [y.var, x.var]
    assert all(isinstance(c, Tracer) and c.builder is outer for c in captures)
    assert [n.primitive.name for n in graph.nodes] == ["add", "sub"]
    # The inner nodes were recorded in the inner graph, not the outer one.
    assert [n.primitive.name for n in outer.graph.nodes] == ["mul"]
    t = np.array([[1.0, 2.0, 3.0]], F32)
    yv = np.array([[10.0, 20.0, 30.0]], F32)
    xv = np.array([[5.0, 5.0, 5.0]], F32)
    a, b = eval_graph(graph, t, yv, xv)
    np.testing.assert_array_equal(host(a), t + yv)
    np.testing.assert_array_equal(host(b), xv - t)


def test_capture_through_two_levels_and_returned_outer_value():
    outer = GraphBuilder()
    x = outer.new_input(aval((2,)))
    with tracing(outer):
        def middle(m):
            inner, caps = trace_flat(lambda i: [ew.add_p.bind(i, x), x], [aval((2,))])
            # The innermost graph captured x straight from the outer trace;
            # the middle trace captures it when the inner graph is evaluated.
            assert caps[0].builder is outer
            return eval_graph(inner, m, *caps)

        graph, captures = trace_flat(middle, [aval((2,))])
    assert [c.var for c in captures] == [x.var]
    out = eval_graph(graph, np.array([1.0, 2.0], F32), np.array([10.0, 20.0], F32))
    np.testing.assert_array_equal(host(out[0]), [11.0, 22.0])
    np.testing.assert_array_equal(host(out[1]), [10.0, 20.0])


def test_tracer_of_a_finished_unrelated_trace_is_refused():
    first = GraphBuilder()
    leaked = first.new_input(aval((2,)))
    other = GraphBuilder(parent=None)
    with pytest.raises(TracerConversionError, match="already returned"):
        other.operand(leaked)


def test_eval_graph_inlines_into_a_running_trace():
    graph, _ = trace_flat(lambda a, b: [ew.mul_p.bind(a, b)], [aval((3,)), aval((3,))])
    outer = GraphBuilder()
    x = outer.new_input(aval((None,)))
    with tracing(outer):
        (y,) = eval_graph(graph, x, x)
    assert isinstance(y, Tracer) and y.shape == (None,)
    assert [n.primitive.name for n in outer.graph.nodes] == ["mul"]


def test_eval_graph_checks_the_number_of_inputs():
    graph, _ = trace_flat(lambda a: [a], [aval((3,))])
    with pytest.raises(TypeError, match="takes 1 inputs"):
        eval_graph(graph)


# -- cond ---------------------------------------------------------------------


def _branches():
    plus, _ = trace_flat(lambda a, b: [ew.add_p.bind(a, b)], [aval((None,)), aval((None,))])
    minus, _ = trace_flat(lambda a, b: [ew.sub_p.bind(a, b)], [aval((None,)), aval((None,))])
    return plus, minus


@pytest.mark.parametrize("index,expected", [(0, [4.0, 6.0]), (1, [-2.0, -2.0]),
                                            (-5, [4.0, 6.0]), (7, [-2.0, -2.0])])
def test_cond_kernel_picks_the_clipped_branch(index, expected):
    plus, minus = _branches()
    a = np.array([1.0, 2.0], F32)
    b = np.array([3.0, 4.0], F32)
    (out,) = cf.cond_p.bind(np.int32(index), a, b, branches=(plus, minus))
    np.testing.assert_array_equal(host(out), expected)


def test_cond_shape_rule_matches_kernel_and_keeps_none():
    plus, minus = _branches()
    (rule,) = cf.cond_p.abstract_eval(aval((), I32), aval((2,)), aval((2,)),
                                      branches=(plus, minus))
    (out,) = cf.cond_p.bind(np.int32(0), np.ones(2, F32), np.ones(2, F32),
                            branches=(plus, minus))
    assert rule.shape == (None,) and rule.dtype == host(out).dtype
    outer = GraphBuilder()
    a = outer.new_input(aval((None,)))
    with tracing(outer):
        (t,) = cf.cond_p.bind(np.int32(1), a, a, branches=(plus, minus))
    assert t.shape == (None,) and t.dtype == F32


def test_cond_shape_rule_names_the_mismatch():
    one, _ = trace_flat(lambda: [Tensor(np.zeros(3, F32))], [])
    other, _ = trace_flat(lambda: [Tensor(np.zeros(4, F32))], [])
    with pytest.raises(ShapeError, match=r"shape \(3,\) differs from \(4,\)"):
        cf.cond_p.abstract_eval(aval((), I32), branches=(one, other))
    as_int, _ = trace_flat(lambda: [Tensor(np.zeros(3, I32))], [])
    with pytest.raises(ShapeError, match="dtype float32 differs from int32"):
        cf.cond_p.abstract_eval(aval((), I32), branches=(one, as_int))


# -- while_loop ---------------------------------------------------------------


def _count_to(limit):
    cond, _ = trace_flat(lambda i, s: [ew.lt_p.bind(i, np.int32(limit))],
                         [aval((), I32), aval((None,))])
    body, _ = trace_flat(
        lambda i, s: [ew.add_p.bind(i, np.int32(1)), ew.mul_p.bind(s, np.float32(2.0))],
        [aval((), I32), aval((None,))],
    )
    return cond, body


def test_while_loop_kernel_and_rule():
    cond, body = _count_to(3)
    i, s = cf.while_p.bind(np.int32(0), np.array([1.0, 3.0], F32),
                           cond_graph=cond, body_graph=body, n_cond_consts=0)
    assert int(host(i)) == 3
    np.testing.assert_array_equal(host(s), [8.0, 24.0])
    rule = cf.while_p.abstract_eval(aval((), I32), aval((2,)), cond_graph=cond,
                                    body_graph=body, n_cond_consts=0)
    assert [r.shape for r in rule] == [(), (None,)]
    assert [r.dtype for r in rule] == [host(i).dtype, host(s).dtype]


def test_while_loop_rejects_a_non_boolean_condition():
    _, body = _count_to(3)
    bad_cond, _ = trace_flat(lambda i, s: [i], [aval((), I32), aval((None,))])
    with pytest.raises(ShapeError, match="one boolean scalar"):
        cf.while_p.abstract_eval(aval((), I32), aval((2,)), cond_graph=bad_cond,
                                 body_graph=body, n_cond_consts=0)


# -- scan ---------------------------------------------------------------------


def _cumsum_body():
    def body(c, x, scale):
        new = ew.add_p.bind(c, ew.mul_p.bind(x, scale))
        return [new, new]

    graph, _ = trace_flat(body, [aval((2,)), aval((2,)), aval(())])
    return graph


@pytest.mark.parametrize("reverse", [False, True])
def test_scan_kernel_matches_numpy_cumsum(reverse):
    xs = np.arange(8, dtype=F32).reshape(4, 2)
    carry, ys = cf.scan_p.bind(
        np.zeros(2, F32), xs, np.float32(10.0), body=_cumsum_body(), length=4,
        reverse=reverse, n_carry=1, n_xs=1, unroll=1,
    )
    order = xs[::-1] if reverse else xs
    expected = np.cumsum(order * 10.0, axis=0)
    if reverse:
        expected = expected[::-1]
    np.testing.assert_allclose(host(ys), expected)
    np.testing.assert_allclose(host(carry), (xs * 10.0).sum(0))


def test_scan_rule_agrees_with_kernel_and_propagates_none_length():
    body = _cumsum_body()
    params = dict(body=body, reverse=False, n_carry=1, n_xs=1, unroll=1)
    carry, ys = cf.scan_p.bind(np.zeros(2, F32), np.ones((5, 2), F32),
                               np.float32(1.0), length=5, **params)
    rule = cf.scan_p.abstract_eval(aval((2,)), aval((5, 2)), aval(()), length=5, **params)
    assert [r.shape for r in rule] == [host(carry).shape, host(ys).shape]
    assert [r.dtype for r in rule] == [host(carry).dtype, host(ys).dtype]
    outer = GraphBuilder()
    xs = outer.new_input(aval((None, 2)))
    with tracing(outer):
        c, y = cf.scan_p.bind(np.zeros(2, F32), xs, np.float32(1.0), length=None, **params)
    assert c.shape == (2,) and y.shape == (None, 2)


def test_scan_rule_rejects_a_carry_that_changes_shape():
    grow, _ = trace_flat(lambda c: [Tensor(np.zeros(3, F32))], [aval((2,))])
    with pytest.raises(ShapeError, match="carry"):
        cf.scan_p.abstract_eval(aval((2,)), body=grow, length=3, reverse=False,
                                n_carry=1, n_xs=0, unroll=1)


def test_scan_with_zero_length_gives_empty_stacked_outputs():
    carry, ys = cf.scan_p.bind(np.ones(2, F32), np.zeros((0, 2), F32), np.float32(1.0),
                               body=_cumsum_body(), length=0, reverse=False,
                               n_carry=1, n_xs=1, unroll=1)
    assert host(ys).shape == (0, 2)
    np.testing.assert_array_equal(host(carry), [1.0, 1.0])


# -- gradient control ---------------------------------------------------------


def test_stop_gradient_is_a_marked_identity():
    x = np.array([1.0, -2.0], F32)
    np.testing.assert_array_equal(host(cf.stop_gradient_p.bind(x)), x)
    assert cf.stop_gradient_p.nondiff
    assert cf.stop_gradient_p.abstract_eval(aval((None, 2))).shape == (None, 2)


def test_optimization_barrier_and_remat_are_identities_on_values():
    x = np.array([1.0, 2.0], F32)
    a, b = cf.optimization_barrier_p.bind(x, np.int32(3))
    np.testing.assert_array_equal(host(a), x)
    assert int(host(b)) == 3
    graph, _ = trace_flat(lambda t: [ew.mul_p.bind(t, t)], [aval((None,))])
    (y,) = cf.remat_p.bind(x, graph=graph)
    np.testing.assert_array_equal(host(y), x * x)
    (r,) = cf.remat_p.abstract_eval(aval((2,)), graph=graph)
    assert r.shape == (None,) and r.dtype == F32


def test_custom_vjp_runs_the_forward_graph():
    fwd, _ = trace_flat(lambda t: [ew.exp_p.bind(t), t], [aval((2,))])
    bwd, _ = trace_flat(lambda ct, res: [ew.mul_p.bind(ct, res)], [aval((2,)), aval((2,))])
    x = np.array([0.0, 1.0], F32)
    out, res = cf.custom_vjp_p.bind(x, fwd=fwd, bwd=bwd, n_outputs=1, n_args=1,
                                    bwd_nonzero=(True,))
    np.testing.assert_allclose(host(out), np.exp(x))
    np.testing.assert_array_equal(host(res), x)


def test_tracer_errors_name_the_keras_layer():
    import keras

    from keras_ipu.device.jit import jit

    def branchy(x):
        with keras.name_scope("model"), keras.name_scope("gate"):
            y = keras.ops.exp(x)
            positive = y[0] > 0
        if positive:  # Python control flow on a value the layer made
            return y
        return -y

    with pytest.raises(TracerConversionError, match="in Keras layer 'model/gate'"):
        jit(branchy)(np.ones(3, np.float32))

    def bad_shapes(x):
        with keras.name_scope("model"), keras.name_scope("proj"):
            # A shape rule's error (the backend's checks come first).
            return ew.add_p.bind(x, np.ones((5,), np.float32))

    with pytest.raises(ValueError, match="in Keras layer 'model/proj'"):
        jit(bad_shapes)(np.ones((3, 4), np.float32))
