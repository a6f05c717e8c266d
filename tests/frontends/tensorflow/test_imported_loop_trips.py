"""The trips of TensorFlow's loops imported from XLA, read from the program
(simulator/loop_trips.py): Graphcore's `loops.repeat(n, ...)` and a
`for _ in tf.range(n)` loop are Repeats of n (the body n times), a loop
until the data says stop keeps the assumed count and says so."""

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from keras_ipu import loops  # noqa: E402
from keras_ipu.device.primitives.control_flow import while_p  # noqa: E402
from keras_ipu.device.simulator import cost_model  # noqa: E402
from keras_ipu.device.simulator import loop_trips  # noqa: E402
from keras_ipu.device.simulator import prediction  # noqa: E402
from keras_ipu.device.simulator.memory_model import graph_of  # noqa: E402
from keras_ipu.frontends.tensorflow.function import BridgedFunction  # noqa: E402


def _step(x):
    return tf.tanh(x) * 2.0


def _loop_costs(fn, *args):
    """[(trips, the loop step's cycles, its body's cycles)] of the while
    loops of `fn`'s program, and the program's Prediction."""
    bridged = BridgedFunction(tf.function(fn, jit_compile=True))
    bridged(*args)
    (exe,) = bridged.executables()
    graph, pred = graph_of(exe), exe.prediction
    found = []
    for i, node in enumerate(graph.nodes):
        if node.primitive is while_p:
            body = prediction.predict_graph(node.params["body_graph"], pred.target)
            found.append((loop_trips.trips(node), pred.steps[i].cycles, body.cycles))
    return found, pred


X = np.ones((64, 64), np.float32)


def test_loops_repeat_is_a_repeat_of_its_count():
    (loop,), pred = _loop_costs(lambda x: loops.repeat(5, _step, [x]), X)
    trips, cycles, body = loop
    assert trips == 5 and cycles == 5 * body
    assert pred.uncounted_loops == 0


def test_a_range_loop_counts_its_python_bound():
    def fn(x, n):
        for _ in tf.range(n):
            x = _step(x)
        return x

    (loop,), pred = _loop_costs(fn, X, 7)
    trips, cycles, body = loop
    assert trips == 7 and cycles == 7 * body and pred.uncounted_loops == 0


def test_a_loop_on_the_data_keeps_the_assumption_and_says_so():
    def fn(x):
        # Two trips at run time (a sum of 4096 ones grows by 4096 a trip).
        return tf.while_loop(lambda x: tf.reduce_sum(x) < 3 * 4096, lambda x: [x + 1.0], [x])[0]

    (loop,), pred = _loop_costs(fn, X)
    assert loop[0] == cost_model.WHILE_LOOP_ASSUMED_TRIPS
    assert pred.uncounted_loops == 1 and "1 while loop(s)" in pred.summary()
