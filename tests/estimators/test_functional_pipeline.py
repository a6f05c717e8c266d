"""pipelining_ops.pipeline with TensorFlow stages (issue 12, item 2): the
values of a pipeline (gradients of gradient_accumulation_count micro-batches
accumulated and applied once per pipeline run), in ipu_compiler programs
and in an IPUPipeline-style estimator loop."""

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

import keras_ipu as ipu  # noqa: E402
from keras_ipu import pipelining_ops  # noqa: E402

RNG = np.random.default_rng(2)
X = RNG.random((32, 4)).astype("float32")
Y = X @ np.array([[1.0], [-2.0], [3.0], [0.5]], "float32")
MB, GAC, LR = 4, 4, 0.05


@pytest.fixture(autouse=True)
def two_ipus(configure_ipus):
    configure_ipus(2)  # the two stages' IPUs


def _stages():
    def stage1(lr, x, y):
        w1 = tf.compat.v1.get_variable("w1", shape=(4, 3),
                                       initializer=tf.compat.v1.constant_initializer(0.1))
        return lr, tf.tanh(tf.matmul(x, w1)), y

    def stage2(lr, h, y):
        w2 = tf.compat.v1.get_variable("w2", shape=(3, 1),
                                       initializer=tf.compat.v1.constant_initializer(0.2))
        return lr, tf.reduce_mean(tf.square(tf.matmul(h, w2) - y))

    return stage1, stage2


def _reference(repeats, method="SUM"):
    w1, w2 = np.full((4, 3), 0.1, np.float32), np.full((3, 1), 0.2, np.float32)
    losses = []
    t = 0
    for _ in range(repeats):
        g1, g2 = np.zeros_like(w1), np.zeros_like(w2)
        for _ in range(GAC):
            k = (t * MB) % len(X)
            x, y = X[k:k + MB], Y[k:k + MB]
            h = np.tanh(x @ w1)
            err = h @ w2 - y
            losses.append(np.mean(err ** 2))
            d = (2.0 / MB) * err
            g2 += h.T @ d
            g1 += x.T @ ((d @ w2.T) * (1 - h ** 2))
            t += 1
        scale = 1.0 / GAC if method == "MEAN" else 1.0
        w1, w2 = w1 - LR * scale * g1, w2 - LR * scale * g2
    return w1, w2, np.array(losses, np.float32)


@pytest.mark.parametrize("method", ["SUM", "MEAN"])
def test_training_pipeline_accumulates_and_applies_once_per_run(method):
    dataset = tf.data.Dataset.from_tensor_slices((X, Y)).batch(MB, drop_remainder=True).repeat()
    infeed = ipu.ipu_infeed_queue.IPUInfeedQueue(dataset)
    outfeed = ipu.ipu_outfeed_queue.IPUOutfeedQueue()
    stage1, stage2 = _stages()

    def optimizer_function(lr, loss):
        return pipelining_ops.OptimizerFunctionOutput(
            tf.compat.v1.train.GradientDescentOptimizer(lr), loss)

    def model(lr):
        return pipelining_ops.pipeline(
            [stage1, stage2], gradient_accumulation_count=GAC, repeat_count=2, inputs=[lr],
            infeed_queue=infeed, outfeed_queue=outfeed, optimizer_function=optimizer_function,
            device_mapping=[0, 1], reduction_method=method, outfeed_loss=True)

    ipu.ipu_compiler.compile(model, inputs=[tf.constant(LR)])
    losses = outfeed.dequeue().numpy()
    w1, w2, expected = _reference(2, method)
    np.testing.assert_allclose(losses, expected[:8], rtol=1e-5)
    ipu.ipu_compiler.compile(model, inputs=[tf.constant(LR)])  # the next two runs
    np.testing.assert_allclose(outfeed.dequeue().numpy(), _reference(4, method)[2][8:], rtol=1e-5)


def test_inference_pipeline_outfeeds_the_last_stage():
    dataset = tf.data.Dataset.from_tensor_slices(X).batch(MB, drop_remainder=True)
    infeed = ipu.ipu_infeed_queue.IPUInfeedQueue(dataset)
    outfeed = ipu.ipu_outfeed_queue.IPUOutfeedQueue()

    def stage1(x):
        return tf.nn.relu(x - 0.5), x

    def stage2(h, x):
        return {"sum": tf.reduce_sum(h, axis=1), "x": x}

    def model():
        return pipelining_ops.pipeline([stage1, stage2], gradient_accumulation_count=8,
                                       infeed_queue=infeed, outfeed_queue=outfeed)

    ipu.ipu_compiler.compile(model)
    out = outfeed.dequeue()
    np.testing.assert_allclose(out["sum"].numpy().reshape(-1),
                               np.maximum(X - 0.5, 0).sum(1), rtol=1e-6)
    assert out["x"].shape == (8, MB, 4)


def test_pipeline_arguments_are_checked():
    with pytest.raises(ValueError, match="inside a function compiled for the IPU"):
        pipelining_ops.pipeline([lambda x: x], gradient_accumulation_count=2)

    def missing_count():
        return pipelining_ops.pipeline([lambda: tf.constant(1.0)])

    with pytest.raises(ValueError, match="gradient_accumulation_count must be specified"):
        ipu.ipu_compiler.compile(missing_count)

    def one_stage():
        return pipelining_ops.pipeline([lambda: tf.constant(1.0)], gradient_accumulation_count=2)

    with pytest.raises(ValueError, match="at least two computational stages"):
        ipu.ipu_compiler.compile(one_stage)

    def bad_mapping():
        return pipelining_ops.pipeline([lambda: tf.constant(1.0), tf.identity],
                                       gradient_accumulation_count=2, device_mapping=[0, 1, 2])

    with pytest.raises(ValueError, match="3 mappings != 2 stages"):
        ipu.ipu_compiler.compile(bad_mapping)

    def no_outfeed():
        return pipelining_ops.pipeline([lambda: tf.constant(1.0), tf.identity],
                                       gradient_accumulation_count=2)

    with pytest.raises(ValueError, match="no outfeed_queue has been provided"):
        ipu.ipu_compiler.compile(no_outfeed)


def _training_model(infeed, outfeed, stages, **kwargs):
    def optimizer_function(lr, loss):
        return pipelining_ops.OptimizerFunctionOutput(
            tf.compat.v1.train.GradientDescentOptimizer(lr), loss)

    def model(lr):
        return pipelining_ops.pipeline(
            list(stages), gradient_accumulation_count=GAC, repeat_count=2, inputs=[lr],
            infeed_queue=infeed, outfeed_queue=outfeed, optimizer_function=optimizer_function,
            outfeed_loss=True, **kwargs)

    return model


def _feeds():
    dataset = tf.data.Dataset.from_tensor_slices((X, Y)).batch(MB, drop_remainder=True).repeat()
    return ipu.ipu_infeed_queue.IPUInfeedQueue(dataset), ipu.ipu_outfeed_queue.IPUOutfeedQueue()


def test_accumulate_outfeed_enqueues_each_runs_sum_once():
    """Graphcore's accumulate_outfeed: the loss summed over the run's
    micro-batches (in float64 here: accumulate_outfeed_dtype), one element
    per pipeline run."""
    infeed, outfeed = _feeds()
    model = _training_model(infeed, outfeed, _stages(), accumulate_outfeed=True,
                            accumulate_outfeed_dtype=tf.float64)
    ipu.ipu_compiler.compile(model, inputs=[tf.constant(LR)])
    sums = outfeed.dequeue().numpy()
    expected = _reference(2)[2].reshape(2, GAC).sum(axis=1)
    assert sums.shape == (2,) and sums.dtype == np.float64
    np.testing.assert_allclose(sums, expected, rtol=1e-5)


def test_recomputation_checkpoint_marks_the_value_and_keeps_the_numbers():
    from keras_ipu.device.primitives.markers import recomputation_checkpoint_p
    from keras_ipu.frontends.tensorflow.function import bridge

    stage1, stage2 = _stages()

    def checkpointed(lr, x, y):
        lr, h, y = stage1(lr, x, y)
        return lr, pipelining_ops.recomputation_checkpoint(h), y

    infeed, outfeed = _feeds()
    model = _training_model(infeed, outfeed, [checkpointed, stage2])
    ipu.ipu_compiler.compile(model, inputs=[tf.constant(LR)])
    np.testing.assert_allclose(outfeed.dequeue().numpy(), _reference(2)[2], rtol=1e-5)

    def program():
        model(tf.constant(LR))

    graph = bridge(program).program([])[3].graph
    found = []

    def walk(g):
        for node in g.nodes:
            if node.primitive is recomputation_checkpoint_p:
                found.append(node.source)
            for value in node.params.values():
                for sub in (value if isinstance(value, tuple) else (value,)):
                    if hasattr(sub, "nodes"):
                        walk(sub)

    walk(graph)
    assert len(found) == 1 and "pipeline_stage_0" in found[0]
    traced = tf.function(lambda: pipelining_ops.recomputation_checkpoint(
        {"a": tf.ones((2,)), "b": [tf.zeros(())]}))
    structure = traced.get_concrete_function().structured_outputs
    assert set(structure) == {"a", "b"} and structure["b"][0].shape == ()


def test_batch_serialization_accumulates_count_times_iterations_micro_batches():
    """gradient_accumulation_count 2 with batch_serialization_iterations 2:
    each weight update sums 4 micro-batches' gradients (Graphcore's tests
    compare such a pipeline with 4 on the CPU), all stages on IPU 0 under
    the Sequential schedule (both the defaults Graphcore picks)."""
    dataset = tf.data.Dataset.from_tensor_slices((X, Y)).batch(MB, drop_remainder=True).repeat()
    infeed = ipu.ipu_infeed_queue.IPUInfeedQueue(dataset)
    outfeed = ipu.ipu_outfeed_queue.IPUOutfeedQueue()
    stage1, stage2 = _stages()
    runs = []

    def optimizer_function(lr, loss):
        return pipelining_ops.OptimizerFunctionOutput(
            tf.compat.v1.train.GradientDescentOptimizer(lr), loss)

    def model(lr):
        from keras_ipu.ops.pipeline_runs import recording

        with recording() as recorded:
            op = pipelining_ops.pipeline(
                [stage1, stage2], gradient_accumulation_count=GAC // 2,
                batch_serialization_iterations=2, repeat_count=2, inputs=[lr],
                infeed_queue=infeed, outfeed_queue=outfeed,
                optimizer_function=optimizer_function, outfeed_loss=True)
        runs.extend(recorded)
        return op

    ipu.ipu_compiler.compile(model, inputs=[tf.constant(LR)])
    w1, w2, expected = _reference(2)
    np.testing.assert_allclose(outfeed.dequeue().numpy(), expected, rtol=1e-5)
    assert runs[0].device_mapping == (0, 0) and runs[0].batch_serialization_iterations == 2
    assert runs[0].schedule == pipelining_ops.PipelineSchedule.Sequential


def test_graphcore_checks_of_the_pipeline():
    two = [lambda x: x, lambda x: x]
    infeed = ipu.ipu_infeed_queue.IPUInfeedQueue(tf.data.Dataset.from_tensor_slices(X))
    last = ipu.ipu_outfeed_queue.IPUOutfeedQueue(
        outfeed_mode=ipu.ipu_outfeed_queue.IPUOutfeedMode.LAST)
    cases = [
        (dict(gradient_accumulation_count=3), ValueError,
         "must be a multiple of 2, but it is 3"),
        (dict(gradient_accumulation_count=4, device_mapping=[0, 1, 0, 1]), ValueError,
         "4 mappings != 2 stages"),
        (dict(gradient_accumulation_count=4, pipeline_schedule=1), TypeError,
         "not a member of the PipelineSchedule enumeration"),
        (dict(gradient_accumulation_count=4, recomputation_mode="Auto"), TypeError,
         "not a member of the RecomputationMode enumeration"),
        (dict(gradient_accumulation_count=4, batch_serialization_iterations=2,
              pipeline_schedule=pipelining_ops.PipelineSchedule.Grouped), NotImplementedError,
         "only supported with the `Sequential` schedule"),
        (dict(gradient_accumulation_count=4, batch_serialization_iterations=2,
              device_mapping=[0, 1]), NotImplementedError, "mapped to a single IPU"),
        (dict(gradient_accumulation_count=4, batch_serialization_iterations=2,
              reduction_method="MEAN", optimizer_function=lambda x: x), ValueError,
         "only supported when reduction_method is GradientAccumulationReductionMethod.SUM"),
        (dict(gradient_accumulation_count=4, accumulate_outfeed=True, outfeed_queue=last),
         ValueError, "must be in IPUOutfeedMode ALL"),
        (dict(gradient_accumulation_count=4, continuous_weight_updates=True),
         NotImplementedError, "Continuous weight updates"),
        (dict(gradient_accumulation_count=4,
              forward_propagation_stages_poplar_options=[pipelining_ops.PipelineStageOptions()]),
         ValueError, "of length 2"),
    ]
    for kwargs, error, message in cases:
        def model():
            return pipelining_ops.pipeline(two, infeed_queue=infeed, **kwargs)

        with pytest.raises(error, match=message):
            ipu.ipu_compiler.compile(model)
