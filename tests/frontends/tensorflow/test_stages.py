"""Pipeline stages of imported TensorFlow programs from their op names
(frontends/tensorflow/stages.py): the rule, and a bridged training loop
compiled placed (memory and cycles per IPU, copies between IPUs), with the
values of the unplaced program."""

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from keras_ipu.device.ir import subgraphs  # noqa: E402
from keras_ipu.frontends.tensorflow.function import BridgedFunction  # noqa: E402
from keras_ipu.frontends.tensorflow.stages import pipeline_stage_of  # noqa: E402
from keras_ipu.frontends.tensorflow.stages import stage_scope_name  # noqa: E402
from keras_ipu.frontends.tensorflow.stages import staged_by_name  # noqa: E402


@pytest.mark.parametrize("name, stage", [
    ("pipeline_stage_0/dense/MatMul", 0),
    ("while/pipeline_stage_1/dense/MatMul", 1),
    ("gradient_tape/while/pipeline_stage_1/matmul/MatMul_1", 1),
    ("pipeline_stage_12/x", 12),
    ("pipeline_stage_1_1/x", 1),  # the scope entered a second time
    ("pipeline_stage_0/inner/pipeline_stage_2/x", 2),  # the innermost wins
    ("my_pipeline_stage_1/x", None),
    ("pipeline_stage_/x", None),
    ("while/add", None),
    ("", None),
])
def test_the_rule_reads_the_stage_scope(name, stage):
    assert pipeline_stage_of(name) == stage


def test_the_scope_name_round_trips():
    assert stage_scope_name(3) == "pipeline_stage_3"
    assert pipeline_stage_of(f"a/{stage_scope_name(3)}/b") == 3


def _weights():
    rng = np.random.default_rng(0)
    return (rng.standard_normal((4, 8)).astype(np.float32),
            rng.standard_normal((8, 2)).astype(np.float32))


def _training_loop(w0, w1):
    def loop(x, n):
        def body(i, x):
            with tf.GradientTape() as tape:
                with tf.name_scope(stage_scope_name(0)):
                    h = tf.nn.relu(x @ w0)
                with tf.name_scope(stage_scope_name(1)):
                    y = tf.reduce_sum(h @ w1)
            g0, g1 = tape.gradient(y, [w0, w1])
            w0.assign_sub(0.1 * g0)
            w1.assign_sub(0.1 * g1)
            return i + 1, x

        return tf.while_loop(lambda i, x: i < n, body, (0, x))[1]

    return loop


def _nodes(graph):
    for node in graph.nodes:
        yield node
        for sub in subgraphs(node):
            yield from _nodes(sub)


def test_a_bridged_training_loop_compiles_placed(configure_ipus):
    configure_ipus(2)  # the placed loop's two IPUs
    a0, a1 = _weights()
    x = np.random.default_rng(1).standard_normal((3, 4)).astype(np.float32)
    results = {}
    for placed in (False, True):
        w0, w1 = tf.Variable(a0), tf.Variable(a1)
        kwargs = dict(stage_of=pipeline_stage_of, device_mapping=(0, 1)) if placed else {}
        fn = BridgedFunction(_training_loop(w0, w1), **kwargs)
        fn(tf.constant(x), tf.constant(3))
        results[placed] = (w0.numpy(), w1.numpy(), fn.executables()[0])
    # Placement changes where things run, not the numbers.
    for got, want in zip(results[True][:2], results[False][:2]):
        np.testing.assert_allclose(got, want, rtol=1e-6)

    exe = results[True][2]
    assert exe.ipus == (0, 1)
    stages = {}
    for node in _nodes(exe.graph):
        if node.source and node.primitive.name != "ipu_copy":
            stage = pipeline_stage_of(node.source)
            if stage is not None:
                assert node.stage == stage and node.ipu == stage, node.source
                stages[stage] = stages.get(stage, 0) + 1
    assert set(stages) == {0, 1}
    # The activation crosses to stage 1, its gradient back to stage 0.
    copies = {(n.params["src"], n.params["dst"]) for n in _nodes(exe.graph)
              if n.primitive.name == "ipu_copy"}
    assert copies == {(0, 1), (1, 0)}
    # Each IPU holds its own stage's weights; the inputs only stage 0 reads
    # (the batch, 3x4 float32, and the loop count, an int32, read by the
    # loop's condition, which runs where its input is) are on IPU 0.
    m0, m1 = exe.memory_by_ipu[0], exe.memory_by_ipu[1]
    assert m0.input_bytes == 4 * 8 * 4 + 3 * 4 * 4 + 4
    assert m1.input_bytes == 8 * 2 * 4
    assert set(exe.prediction.ipu_cycles) == {0, 1}
    assert sum(exe.prediction.ipu_cycles.values()) == exe.prediction.cycles
    # The unplaced program: one IPU.
    assert results[False][2].ipus == (0,)


def test_a_rule_giving_no_stage_to_any_op_is_refused_by_the_placement():
    w0, w1 = (tf.Variable(a) for a in _weights())
    fn = BridgedFunction(_training_loop(w0, w1), stage_of=lambda name: None)
    with pytest.raises(ValueError, match="No node of the program"):
        fn(tf.constant(np.ones((3, 4), np.float32)), tf.constant(1))


def test_a_bad_stage_from_the_rule_names_the_op():
    w0, w1 = (tf.Variable(a) for a in _weights())
    fn = BridgedFunction(_training_loop(w0, w1))
    _, _, _, program = fn.program((tf.constant(np.ones((3, 4), np.float32)), tf.constant(1)))
    with pytest.raises(ValueError, match=r"gave -1 for the TensorFlow op '.*pipeline_stage_0"):
        staged_by_name(program.graph, lambda name: -1 if "pipeline_stage_0" in name else None)
