"""A functional pipeline placed and simulated as the Keras pipelines are
(issue 12, item 2): its stages on the IPUs of device_mapping (the name
scopes pipeline_stage_<k>), the schedule in the predicted time and memory
by the one sharding model, checked by hand against its formulas and
against the Keras pipeline's prediction for the same two-stage model."""

import os

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

import keras_ipu as ipu  # noqa: E402
from keras_ipu import pipelining_ops  # noqa: E402
from keras_ipu.frontends.tensorflow.function import bridge  # noqa: E402
from keras_ipu.ops.pipeline_simulation import predict_pipeline  # noqa: E402

MB, GAC, IN, HIDDEN = 8, 8, 16, 32
X = np.random.default_rng(0).random((64, IN)).astype("float32")
Y = X.sum(axis=1, keepdims=True)
SCHEDULES = ("Grouped", "Interleaved", "Sequential")


@pytest.fixture(autouse=True)
def two_ipus(configure_ipus):
    configure_ipus(2)


def _stages():
    def stage1(x, y):
        w = tf.compat.v1.get_variable("w1", shape=(IN, HIDDEN),
                                      initializer=tf.compat.v1.constant_initializer(0.01))
        return tf.tanh(tf.matmul(x, w)), y

    def stage2(h, y):
        w = tf.compat.v1.get_variable("w2", shape=(HIDDEN, 1),
                                      initializer=tf.compat.v1.constant_initializer(0.02))
        return tf.reduce_mean(tf.square(tf.matmul(h, w) - y))

    return [stage1, stage2]


def _program(schedule, device_mapping=(0, 1), gac=GAC, batch_serialization_iterations=1):
    dataset = tf.data.Dataset.from_tensor_slices((X, Y)).batch(MB, drop_remainder=True).repeat()
    infeed = ipu.ipu_infeed_queue.IPUInfeedQueue(dataset)
    outfeed = ipu.ipu_outfeed_queue.IPUOutfeedQueue()

    def optimizer_function(loss):
        return pipelining_ops.OptimizerFunctionOutput(
            tf.compat.v1.train.GradientDescentOptimizer(0.01), loss)

    stages = _stages()  # one store of variables for the program's traces

    def program():
        pipelining_ops.pipeline(
            stages, gradient_accumulation_count=gac, infeed_queue=infeed,
            batch_serialization_iterations=batch_serialization_iterations,
            outfeed_queue=outfeed, optimizer_function=optimizer_function, outfeed_loss=True,
            device_mapping=list(device_mapping),
            pipeline_schedule=getattr(pipelining_ops.PipelineSchedule, schedule))

    bridged = bridge(program)
    bridged.run([])
    _, _, _, compiled = bridged.program([])
    return bridged.executable(compiled), compiled.pipeline, outfeed.dequeue().numpy()


def _keras_prediction(schedule):
    import keras

    from keras_ipu.models.prediction import predict_training

    strategy = ipu.ipu_strategy.IPUStrategy()
    with strategy.scope():
        x = keras.Input((IN,), batch_size=MB)
        with ipu.keras.PipelineStage(0):
            h = keras.layers.Dense(HIDDEN, activation="tanh", use_bias=False)(x)
        with ipu.keras.PipelineStage(1):
            y = keras.layers.Dense(1, use_bias=False)(h)
        model = keras.Model(x, y)
        model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
        model.set_pipelining_options(
            gradient_accumulation_steps_per_replica=GAC,
            pipeline_schedule=getattr(pipelining_ops.PipelineSchedule, schedule))
    return predict_training(model, MB).sharded


def test_stages_run_on_their_ipus_and_the_schedule_changes_time_and_memory():
    predictions = {}
    for schedule in SCHEDULES:
        exe, run, losses = _program(schedule, device_mapping=(1, 0))
        assert losses.shape == (GAC,) and np.all(np.isfinite(losses))
        # Stage 0 on IPU 1, stage 1 on IPU 0, values crossing between them.
        pred = predict_pipeline(exe, run)
        assert [(p.ipu, p.stages) for p in pred.ipus] == [(1, (0,)), (0, (1,))]
        assert pred.copies and {(c.src, c.dst) for c in pred.copies} == {(1, 0), (0, 1)}
        predictions[schedule] = pred
    g, n = GAC, 2
    for schedule, pred in predictions.items():
        first, last = pred.ipus
        update = max(p.weight_update_cycles for p in pred.ipus)
        if schedule == "Grouped":
            expected = (g + n - 1) * max(p.forward_cycles + p.backward_cycles
                                         for p in pred.ipus) + update
            flight = 2 * (n - 1) + 1
        elif schedule == "Interleaved":
            expected = (g + n - 1) * (max(p.forward_cycles for p in pred.ipus)
                                      + max(p.backward_cycles for p in pred.ipus)) + update
            flight = n
        else:
            expected = g * sum(p.forward_cycles + p.backward_cycles for p in pred.ipus) + sum(
                p.weight_update_cycles for p in pred.ipus)
            flight = 1
        assert pred.step_cycles == expected
        # The first stage stashes what its backward pass reads, once per
        # micro-batch in flight: tanh's output, the micro-batch it read from
        # the infeed (the matmul's gradient), and the infeed's u32 token.
        assert first.stash_bytes == MB * HIDDEN * 4 + MB * IN * 4 + 4
        assert first.in_flight == flight and last.in_flight == 1
    stash = predictions["Grouped"].ipus[0].stash_bytes
    memory = {s: p.ipus[0].memory.not_always_live_bytes for s, p in predictions.items()}
    assert memory["Grouped"] - memory["Sequential"] == 2 * stash
    assert memory["Interleaved"] - memory["Sequential"] == stash
    assert (predictions["Grouped"].step_cycles < predictions["Interleaved"].step_cycles
            <= predictions["Sequential"].step_cycles)


def test_batch_serialization_holds_its_iterations_micro_batches_at_once():
    """All stages on IPU 0 under the Sequential schedule: batch serialization
    over 2 micro-batches (count 4) runs the values and cycles of 8
    micro-batches per update, and holds the stash of 2 at once, with the
    values passed between its stages."""
    exe, run, losses = _program("Sequential", (0, 0), gac=GAC)
    serial_exe, serial_run, serial_losses = _program(
        "Sequential", (0, 0), gac=GAC // 2, batch_serialization_iterations=2)
    np.testing.assert_allclose(serial_losses, losses, rtol=1e-6)
    plain, serial = predict_pipeline(exe, run), predict_pipeline(serial_exe, serial_run)
    assert serial.gradient_accumulation_count == plain.gradient_accumulation_count == GAC
    assert serial.step_cycles == plain.step_cycles
    (ipu0,), (serial_ipu0,) = plain.ipus, serial.ipus
    assert (ipu0.in_flight, serial_ipu0.in_flight) == (1, 2)
    # What the backward passes read from the forward ones, per micro-batch,
    # in the program that runs (the simulator reads the fused loop body,
    # whose forward makes tanh's derivative beside tanh's output): that
    # derivative, the micro-batch, the infeed's token, and the gradient of
    # tanh's output that the last stage makes (its backward counts in its
    # forward slot: sharding.py's phases). tanh's output itself is read
    # only by the last stage, within its own slot.
    stash = 2 * MB * HIDDEN * 4 + MB * IN * 4 + 4
    assert ipu0.stash_bytes == stash
    # Serialized, stage 0 runs its forward for both slices before stage 1
    # runs: tanh's output waits in the stage-boundary buffer of b slices
    # (Poplar's CreateBuffer) too.
    serial_stash = stash + MB * HIDDEN * 4
    assert serial_ipu0.stash_bytes == serial_stash
    assert (serial_ipu0.memory.not_always_live_bytes
            - ipu0.memory.not_always_live_bytes) == serial_stash


def test_the_keras_pipeline_of_the_same_model_predicts_the_same_layout():
    """The same two-stage model as a Keras pipeline: the same IPUs and
    micro-batches in flight under each schedule, the same activation stash
    (the Keras step takes the micro-batch as a program input, which the
    model does not count as stashed; the functional loop reads it, and the
    infeed's token, from the infeed), the same dot products. The programs
    differ in their loss, loop and feed ops, so their cycles differ."""
    for schedule in SCHEDULES:
        exe, run, _ = _program(schedule)
        functional = predict_pipeline(exe, run)
        keras_pred = _keras_prediction(schedule)
        assert [p.stages for p in functional.ipus] == [p.stages for p in keras_pred.ipus]
        assert [p.in_flight for p in functional.ipus] == [p.in_flight for p in keras_pred.ipus]
        assert [p.stash_bytes for p in functional.ipus] == [
            keras_pred.ipus[0].stash_bytes + MB * IN * 4 + 4, keras_pred.ipus[1].stash_bytes]
        assert functional.schedule == keras_pred.schedule == schedule
        assert functional.gradient_accumulation_count == keras_pred.gradient_accumulation_count


def test_an_ipu_that_cannot_hold_its_stage_fails_naming_it():
    from keras_ipu.device.simulator.memory_model import IPUOutOfMemoryError

    dataset = tf.data.Dataset.from_tensor_slices(np.zeros((4, 2), "float32")).batch(
        2, drop_remainder=True).repeat()
    infeed = ipu.ipu_infeed_queue.IPUInfeedQueue(dataset)
    outfeed = ipu.ipu_outfeed_queue.IPUOutfeedQueue()

    def stage1(x):
        return x * 2.0

    def stage2(x):
        # 1.2 GB of float32 on stage 1's IPU (an ipu2 holds about 900 MiB);
        # the check comes before anything runs, so nothing is allocated.
        return tf.reduce_sum(tf.broadcast_to(x[0, 0], (300_000_000,)) * x[1, 1])

    def program():
        pipelining_ops.pipeline([stage1, stage2], gradient_accumulation_count=2,
                                infeed_queue=infeed, outfeed_queue=outfeed,
                                device_mapping=[1, 0])

    # Stage 1 is on IPU 0: the compiler's memory check names that IPU.
    with pytest.raises(IPUOutOfMemoryError, match="Out of memory on IPU 0"):
        ipu.ipu_compiler.compile(program)


def test_an_inference_pipeline_has_no_backward_pass():
    dataset = tf.data.Dataset.from_tensor_slices(X).batch(MB, drop_remainder=True).repeat()
    infeed = ipu.ipu_infeed_queue.IPUInfeedQueue(dataset)
    outfeed = ipu.ipu_outfeed_queue.IPUOutfeedQueue()
    w1 = tf.Variable(np.full((IN, HIDDEN), 0.01, "float32"))
    w2 = tf.Variable(np.full((HIDDEN, 1), 0.02, "float32"))

    def program():
        pipelining_ops.pipeline([lambda x: tf.tanh(tf.matmul(x, w1)), lambda h: tf.matmul(h, w2)],
                                gradient_accumulation_count=GAC, infeed_queue=infeed,
                                outfeed_queue=outfeed)

    bridged = bridge(program)
    bridged.run([])
    (out,) = outfeed.dequeue()  # the last stage's outputs, as a list
    np.testing.assert_allclose(out.numpy().reshape(-1, 1),
                               np.tanh(X[:GAC * MB] @ w1.numpy()) @ w2.numpy(), rtol=1e-5)
    _, _, _, compiled = bridged.program([])
    pred = predict_pipeline(bridged.executable(compiled), compiled.pipeline)
    assert all(p.backward_cycles == 0 and p.stash_bytes == 0 for p in pred.ipus)
    assert pred.step_cycles == (GAC + 1) * max(p.forward_cycles for p in pred.ipus)
