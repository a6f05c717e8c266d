"""application_compile_op + embedded_runtime: a function compiled into an
executable file, then run from that file by the embedded runtime (one
infeed element in, its outfeed values out, per call), with the values of
the function run by ipu_compiler.compile."""

import gc
import os

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

import keras_ipu as ipu  # noqa: E402
from keras_ipu.ops import application_file  # noqa: E402

compile_op = ipu.application_compile_op.experimental_application_compile_op
runtime = ipu.embedded_runtime


def _squares(tmp_path, repeats=2, name="squares.ipu_app"):
    """Graphcore's application_compile_and_run_test program: x * x outfed
    for each infeed element."""
    infeed = ipu.ipu_infeed_queue.IPUInfeedQueue(
        tf.data.Dataset.from_tensor_slices(np.ones(10, np.float32)))
    outfeed = ipu.ipu_outfeed_queue.IPUOutfeedQueue()

    def body(x):
        return outfeed.enqueue(x * x)

    def my_net():
        return ipu.loops.repeat(repeats, body, [], infeed)

    return compile_op(my_net, output_path=str(tmp_path / name))


def test_graphcores_compile_and_run_example(tmp_path):
    path = _squares(tmp_path)
    assert path.dtype == tf.string and os.path.exists(path.numpy().decode())
    # The queues the program was compiled with are gone: the file runs alone.
    gc.collect()
    ctx = runtime.embedded_runtime_start(path, [], "engine_squares")
    assert ctx.name() == "engine_squares" and ctx.output_types() == [tf.float32]
    for x in [2.0, 3.0, -1.5, 4.0, 0.5]:  # across runs of the 2-iteration loop
        (out,) = runtime.embedded_runtime_call([tf.constant(x)], ctx)
        assert float(out) == x * x
    with pytest.raises(NotImplementedError, match="doesn't support stopping"):
        runtime.embedded_runtime_stop(ctx)


def test_arguments_and_variables_are_start_inputs_and_persist(tmp_path):
    w = tf.Variable(np.arange(12, dtype=np.float32).reshape(4, 3) / 10, name="w")
    count = tf.Variable(0.0, name="count")
    data = np.random.default_rng(0).normal(size=(6, 2, 4)).astype(np.float32)

    def make(dataset):
        infeed = ipu.ipu_infeed_queue.IPUInfeedQueue(dataset)
        outfeed = ipu.ipu_outfeed_queue.IPUOutfeedQueue()

        def body(bias, x):
            count.assign_add(1.0)
            outfeed.enqueue({"y": tf.matmul(x, w) + bias, "n": count.read_value()})
            return bias

        def net(bias):
            return ipu.loops.repeat(3, body, [bias], infeed)

        return net, outfeed

    bias = tf.constant([1.0, -2.0, 0.5])
    net, _ = make(tf.data.Dataset.from_tensor_slices(data))
    path = compile_op(net, inputs=[bias], output_path=str(tmp_path / "app"))
    app = application_file.read(path.numpy().decode())
    # The argument, then the variables (in the order the trace captured them).
    assert app.inputs[0].name == "input_0" and app.inputs[0].shape == (3,)
    assert {(s.name, s.shape) for s in app.inputs[1:]} == {("w:0", (4, 3)), ("count:0", ())}
    assert [s.shape for s in app.streamed_inputs] == [(2, 4)]
    assert sorted(s.shape for s in app.streamed_outputs) == [(), (2, 3)]

    ctx = runtime.embedded_runtime_start(
        path, {"input_0": bias, "w:0": w, "count:0": tf.constant(10.0)}, "engine_vars")
    outs = [runtime.embedded_runtime_call([data[k]], ctx) for k in range(6)]
    # The same values as the function run through ipu_compiler.compile.
    count.assign(10.0)
    net2, outfeed = make(tf.data.Dataset.from_tensor_slices(data))
    for _ in range(2):
        ipu.ipu_compiler.compile(net2, inputs=[bias])
    want = outfeed.dequeue()
    # Each call's outputs: the outfeed's components in tf.nest order (n, y).
    got = {k: np.stack([o[j].numpy() for o in outs]) for j, k in enumerate(("n", "y"))}
    np.testing.assert_allclose(got["y"], want["y"].numpy(), rtol=1e-6)
    np.testing.assert_array_equal(got["n"], np.arange(11, 17, dtype=np.float32))
    np.testing.assert_array_equal(want["n"].numpy(), got["n"])


def test_frozen_variables_are_not_inputs(tmp_path):
    w = tf.Variable([2.0, 3.0])
    infeed = ipu.ipu_infeed_queue.IPUInfeedQueue(
        tf.data.Dataset.from_tensor_slices(np.ones((4, 2), np.float32)))
    outfeed = ipu.ipu_outfeed_queue.IPUOutfeedQueue()

    def net():
        return ipu.loops.repeat(1, lambda x: outfeed.enqueue(x * w), [], infeed)

    path = compile_op(net, output_path=str(tmp_path / "frozen"), freeze_variables=True)
    w.assign([100.0, 100.0])  # frozen at compile time
    out, ctx = runtime.embedded_runtime_start_and_call(
        path, [], [np.array([1.0, -1.0], np.float32)], "engine_frozen")
    np.testing.assert_array_equal(out[0].numpy(), [2.0, -3.0])


def test_graphcores_checks(tmp_path):
    path = _squares(tmp_path)
    with pytest.raises(ValueError, match="expects 0 inputs, but 1 were provided"):
        runtime.embedded_runtime_start(path, [tf.constant(1.0)], "e")
    with pytest.raises(TypeError, match="Expected the inputs to be a list"):
        runtime.embedded_runtime_start(path, tf.constant(1.0), "e")
    ctx = runtime.embedded_runtime_start(path, [], "e")
    with pytest.raises(ValueError, match="call expects 1 inputs, but 2 were provided"):
        runtime.embedded_runtime_call([1.0, 2.0], ctx)
    with pytest.raises(ValueError, match=r"Mismatched input shape at position 0 .*Expected \[\]"):
        runtime.embedded_runtime_call([np.zeros(2, np.float32)], ctx)
    with pytest.raises(TypeError, match="Expected float32, but input 0 has dtype int32"):
        runtime.embedded_runtime_call([np.int32(1)], ctx)
    junk = tmp_path / "junk"
    junk.write_bytes(b"not an executable")
    with pytest.raises(ValueError, match="is not a keras_ipu application executable"):
        runtime.embedded_runtime_start(str(junk), [], "e")


def test_a_host_stream_other_than_the_feeds_is_refused(tmp_path):
    def net(x):
        ipu.internal_ops.print_tensor(x)
        return x + 1.0

    with pytest.raises(NotImplementedError, match="only infeeds and outfeeds"):
        compile_op(net, inputs=[tf.constant(1.0)], output_path=str(tmp_path / "p"))
    assert not (tmp_path / "p").exists()


def test_the_file_is_written_atomically(tmp_path, monkeypatch):
    target = tmp_path / "app"
    target.write_bytes(b"the old file")
    # The header is written, then the program's bytes fail to write.
    monkeypatch.setattr(application_file.pickle, "dumps", lambda *a, **k: "not bytes")
    with pytest.raises(TypeError):
        _squares(tmp_path, name="app")
    monkeypatch.undo()
    assert target.read_bytes() == b"the old file"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["app"]


def test_the_engine_thread_ends_with_its_context(tmp_path):
    ctx = runtime.embedded_runtime_start(_squares(tmp_path), [], "engine_gc")
    assert float(runtime.embedded_runtime_call([tf.constant(3.0)], ctx)[0]) == 9.0
    thread = ctx.start_output()._thread
    assert thread.is_alive()  # waiting, in the middle of a run, for the next call
    del ctx
    gc.collect()
    thread.join(timeout=10)
    assert not thread.is_alive()


# -- pipelined and replicated programs (Graphcore's embedded runtime docs:
# a pipelined application, its calls in parallel threads; its runtime
# refuses a replication factor above one) -------------------------------------

def _flush_pipeline(tmp_path):
    """Graphcore's test_pipeline_flush program: two stages on two IPUs,
    gradient accumulation count 12, the sum of x @ ones outfed per element."""
    dataset = tf.data.Dataset.from_tensor_slices(np.zeros((4, 2, 2), np.float32)).repeat()
    infeed = ipu.ipu_infeed_queue.IPUInfeedQueue(dataset)
    outfeed = ipu.ipu_outfeed_queue.IPUOutfeedQueue()

    def stage1(x):
        return x @ tf.constant(1.0, shape=[2, 2])

    def stage2(x):
        return tf.reduce_sum(x)

    def my_net():
        return ipu.pipelining_ops.pipeline([stage1, stage2], 12, infeed_queue=infeed,
                                           outfeed_queue=outfeed)

    return compile_op(my_net, output_path=str(tmp_path / "pipeline_flush"))


def test_a_pipelined_program_serves_each_call_its_own_element(tmp_path, configure_ipus):
    configure_ipus(2)
    path = _flush_pipeline(tmp_path)
    app = application_file.read(path.numpy().decode())
    assert app.replication_factor == 1 and sorted(app.executable.ipus) == [0, 1]
    ctx = runtime.embedded_runtime_start(path, [], "pipeline_flush")
    # Graphcore's numbers: [[1, 1], [1, 1]] gives 8, twice that 16.
    for value, want in [(1.0, 8.0), (2.0, 16.0)]:
        (out,) = runtime.embedded_runtime_call([np.full([2, 2], value, np.float32)], ctx)
        assert float(out) == want
    # Calls from parallel threads (as the docs advise for a pipelined
    # application), across the end of a run of 12 elements: each gets the
    # result of its own element.
    import concurrent.futures

    data = np.random.default_rng(1).normal(size=(24, 2, 2)).astype(np.float32)

    def call(x):
        return float(runtime.embedded_runtime_call([x], ctx)[0])

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        got = list(pool.map(call, data))
    np.testing.assert_allclose(got, [2.0 * x.sum() for x in data], rtol=1e-5)


def test_a_pipelined_training_program_keeps_its_weights_between_runs(tmp_path, configure_ipus):
    configure_ipus(2)
    rng = np.random.default_rng(2)
    xs = rng.normal(size=(8, 3, 4)).astype(np.float32)
    ys = rng.normal(size=(8, 3, 1)).astype(np.float32)
    start = {"w1:0": np.full((4, 2), 0.3, np.float32), "w2:0": np.full((2, 1), -0.2, np.float32)}

    def make():
        infeed = ipu.ipu_infeed_queue.IPUInfeedQueue(
            tf.data.Dataset.from_tensor_slices((xs, ys)))
        outfeed = ipu.ipu_outfeed_queue.IPUOutfeedQueue()

        # TF1 variables, as Graphcore's pipelines make them (the v1
        # optimizer finds them in the trainable collection).
        def stage1(x, y):
            w1 = tf.compat.v1.get_variable(
                "w1", initializer=tf.compat.v1.constant_initializer(0.3), shape=(4, 2))
            return tf.tanh(x @ w1), y

        def stage2(h, y):
            w2 = tf.compat.v1.get_variable(
                "w2", initializer=tf.compat.v1.constant_initializer(-0.2), shape=(2, 1))
            return tf.reduce_mean(tf.square(h @ w2 - y))

        def optimizer_function(loss):
            return ipu.pipelining_ops.OptimizerFunctionOutput(
                tf.compat.v1.train.GradientDescentOptimizer(0.5), loss)

        def net():
            return ipu.pipelining_ops.pipeline(
                [stage1, stage2], 4, infeed_queue=infeed, outfeed_queue=outfeed,
                optimizer_function=optimizer_function, outfeed_loss=True)

        return net, outfeed

    net, _ = make()
    path = compile_op(net, output_path=str(tmp_path / "pipeline_training"))
    assert {(i.name, i.shape) for i in application_file.read(path.numpy().decode()).inputs} == {
        ("w1:0", (4, 2)), ("w2:0", (2, 1))}
    ctx = runtime.embedded_runtime_start(path, start, "pipeline_training")
    # Two runs of 4 micro-batches: one weight update each.
    losses = [float(runtime.embedded_runtime_call([xs[k], ys[k]], ctx)[0]) for k in range(8)]
    # The same program run twice by ipu_compiler.compile from the same weights.
    net2, outfeed = make()
    for _ in range(2):
        ipu.ipu_compiler.compile(net2)
    want = outfeed.dequeue().numpy()
    np.testing.assert_allclose(losses, want, rtol=1e-5)
    # The second run's losses are of the updated weights: by hand.
    a, b = start["w1:0"], start["w2:0"]
    h = np.tanh(xs[:4] @ a)
    error = h @ b - ys[:4]
    grad_b = sum(2.0 * h[k].T @ error[k] / 3 for k in range(4))
    grad_a = sum(xs[k].T @ ((2.0 * error[k] / 3 @ b.T) * (1 - h[k] ** 2)) for k in range(4))
    a, b = a - 0.5 * grad_a, b - 0.5 * grad_b
    by_hand = [np.mean((np.tanh(xs[k] @ a) @ b - ys[k]) ** 2) for k in range(4, 8)]
    np.testing.assert_allclose(losses[4:], by_hand, rtol=1e-4)


def test_a_replicated_program_is_refused_as_graphcore_refuses_it(tmp_path, configure_ipus):
    configure_ipus(2)
    # A one-IPU program on a device of two: two replicas.
    path = _squares(tmp_path)
    assert application_file.read(path.numpy().decode()).replication_factor == 2
    with pytest.raises(NotImplementedError,
                       match="does not support executables with a replication factor "
                             "greater than one .this one has 2"):
        runtime.embedded_runtime_start(path, [], "replicated")
