"""A while loop's trips read from the program (simulator/loop_trips.py):
a loop whose counters start from constants and are stepped by elementwise
arithmetic is a Poplar Repeat of its count (the body that many times, no
condition: cost_model [TFREPEAT]); any other keeps the stated assumption."""

import pytest

from keras_ipu.device.simulator import cost_model as cm
from keras_ipu.device.simulator import loop_trips
from keras_ipu.device.simulator.prediction import predict_costs
from keras_ipu.device.simulator.targets import TARGETS

from compiler_graphs import aval
from compiler_graphs import build
from compiler_graphs import lit

IPU2 = TARGETS["ipu2"]
I32 = aval((), "int32")
X = aval((512,))


def _loop(start, cond_fn, step=1, bound_carry=None, x=None):
    """A program running while_loop(i, [bound,] x) with `cond_fn(b, i[, n])`
    and a body stepping i by `step` and negating x; (program, body, cond)."""
    carries = [I32] + ([I32] if bound_carry is not None else []) + [X]

    def cond(b, i, *rest):
        return cond_fn(b, i, *rest[:-1])

    def body(b, i, *rest):
        return [b.op("add", i, lit(step, "int32")), *rest[:-1], b.op("neg", rest[-1])]

    cond_graph, body_graph = build(carries, cond), build(carries, body)

    def program(b, *inputs):
        first = inputs[0] if start is None else lit(start, "int32")
        bound = [] if bound_carry is None else [lit(bound_carry, "int32")]
        return b.op("while_loop", first, *bound, inputs[-1], cond_graph=cond_graph,
                    body_graph=body_graph, n_cond_consts=0)

    ins = ([I32] if start is None else []) + [X]
    return build(ins, program), body_graph, cond_graph


def _cycles(graph):
    return predict_costs(graph, target=IPU2).cycles


def test_a_counted_loop_costs_its_trips_of_the_body_and_no_condition():
    g, body, _ = _loop(0, lambda b, i: b.op("lt", i, lit(7, "int32")))
    assert _cycles(g) == 7 * _cycles(body)


@pytest.mark.parametrize("start,compare,bound,step,trips", [
    (2, "le", 20, 3, 7),      # 2, 5, ..., 20
    (10, "gt", 0, -4, 3),     # 10, 6, 2
    (0, "ne", 12, 4, 3),      # 0, 4, 8
    (5, "lt", 5, 1, 0),       # never
])
def test_trips_follow_the_comparison_and_the_step(start, compare, bound, step, trips):
    g, body, _ = _loop(start, lambda b, i: b.op(compare, i, lit(bound, "int32")), step=step)
    (node,) = g.nodes
    assert loop_trips.trips(node) == trips
    assert _cycles(g) == trips * _cycles(body)


def test_a_bound_carried_through_the_loop_as_tensorflow_passes_it():
    # tf.range(n) in a tf.function: the limit is a loop-invariant carry that
    # starts as a constant.
    g, body, _ = _loop(0, lambda b, i, n: b.op("lt", i, n), bound_carry=5)
    assert loop_trips.trips(g.nodes[0]) == 5
    assert _cycles(g) == 5 * _cycles(body)


def test_two_counters_and_together_stop_at_the_first():
    def cond(b, i, n):
        return b.op("and", b.op("lt", i, lit(9, "int32")), b.op("lt", n, lit(4, "int32")))

    # n is carried unchanged: at 3 only i decides (9 trips), at 7 the
    # loop never runs.
    g, body, _ = _loop(0, cond, bound_carry=3)
    assert loop_trips.trips(g.nodes[0]) == 9
    g, body, _ = _loop(0, cond, bound_carry=7)
    assert loop_trips.trips(g.nodes[0]) == 0


def test_a_bound_the_program_reads_from_its_input_keeps_the_assumption():
    g, body, cond = _loop(None, lambda b, i: b.op("lt", i, lit(7, "int32")))
    n = cm.WHILE_LOOP_ASSUMED_TRIPS
    assert loop_trips.known_trips(tuple(g.nodes[0].inputs), **g.nodes[0].params) is None
    assert _cycles(g) == n * _cycles(body) + (n + 1) * _cycles(cond)
    # ... and the prediction says so (a counted loop says nothing).
    p = predict_costs(g, target=IPU2)
    assert p.uncounted_loops == 1
    assert p.summary().endswith(
        f"; 1 while loop(s) whose trips the program does not fix counted {n} trip(s) each")
    counted, _, _ = _loop(0, lambda b, i: b.op("lt", i, lit(7, "int32")))
    assert predict_costs(counted, target=IPU2).uncounted_loops == 0
    assert "while loop" not in predict_costs(counted, target=IPU2).summary()


def test_a_condition_on_the_data_keeps_the_assumption():
    def cond(b, i):
        return b.op("lt", i, lit(7, "int32"))

    carries = [I32, X]
    cond_graph = build(carries, lambda b, i, x: b.op(
        "lt", b.op("reduce_sum", x, axes=(0,)), lit(1.0, "float32")))
    body_graph = build(carries, lambda b, i, x: [b.op("add", i, lit(1, "int32")), b.op("neg", x)])
    g = build([X], lambda b, x: b.op("while_loop", lit(0, "int32"), x, cond_graph=cond_graph,
                                     body_graph=body_graph, n_cond_consts=0))
    assert loop_trips.known_trips(tuple(g.nodes[0].inputs), **g.nodes[0].params) is None


def test_a_loop_beyond_the_counting_bound_keeps_the_assumption(monkeypatch):
    monkeypatch.setattr(cm, "WHILE_LOOP_MAX_COUNTED_TRIPS", 50)
    g, _, _ = _loop(0, lambda b, i: b.op("lt", i, lit(51, "int32")))
    assert loop_trips.trips(g.nodes[0]) == cm.WHILE_LOOP_ASSUMED_TRIPS
    g, _, _ = _loop(1, lambda b, i: b.op("lt", i, lit(51, "int32")))
    assert loop_trips.trips(g.nodes[0]) == 50
