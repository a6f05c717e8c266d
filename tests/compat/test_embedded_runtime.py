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
