"""The TensorFlow front end as a whole: error messages, node sources,
compile-time constant arguments, host regions (outside compilation) and
their predicted host transfers, the stream primitives."""

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from keras_ipu.device import host_streams  # noqa: E402
from keras_ipu.device.compiler import CompileOptions  # noqa: E402
from keras_ipu.device.ir import ShapedArray  # noqa: E402
from keras_ipu.device.primitives import host_transfer  # noqa: E402
from keras_ipu.device.primitives import elementwise as ew  # noqa: E402
from keras_ipu.device.simulator import cost_model  # noqa: E402
from keras_ipu.device.simulator import prediction  # noqa: E402
from keras_ipu.device.simulator.targets import get_target  # noqa: E402
from keras_ipu.device.trace import trace_flat  # noqa: E402
from keras_ipu.frontends.tensorflow.function import BridgedFunction  # noqa: E402
from keras_ipu.frontends.tensorflow.function import _Tracing  # noqa: E402
from keras_ipu.frontends.tensorflow.importer import HloImportError  # noqa: E402
from keras_ipu.frontends.tensorflow.importer import import_module  # noqa: E402

X = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)


def _module(fn, *args):
    bridged = BridgedFunction(tf.function(fn, jit_compile=True))
    cf = bridged.concrete(*args)
    return bridged.hlo_module(cf, *bridged.flat_inputs(cf, args, {}))


def test_unknown_opcode_names_it_and_the_tensorflow_op():
    module = _module(lambda x: tf.nn.softplus(x) * 3.0, tf.constant(X))
    entry = next(c for c in module.computations if c.id == module.entry_computation_id)
    victim = next(i for i in entry.instructions if i.opcode == "multiply")
    victim.opcode = "fancy-new-op"
    with pytest.raises(HloImportError) as info:
        import_module(module)
    text = str(info.value)
    assert "fancy-new-op" in text
    assert victim.metadata.op_name in text and victim.metadata.op_type in text


def test_what_xla_cannot_compile_fails_with_tensorflows_message():
    bridged = BridgedFunction(tf.function(lambda x: tf.strings.as_string(x)))
    with pytest.raises(Exception, match="AsString"):
        bridged(tf.constant(X))


def test_nodes_carry_the_tensorflow_op_names():
    w = tf.Variable(np.ones((4, 2), np.float32))

    def fn(x):
        with tf.name_scope("layer_one"):
            return tf.nn.relu(tf.matmul(x, w, name="project"))

    module = _module(fn, tf.constant(X))
    graph = import_module(module).graph
    sources = {n.source for n in graph.nodes}
    assert any(s and s.endswith("layer_one/project") for s in sources), sources
    assert any(s and "layer_one/Relu" in s for s in sources), sources


def test_compile_time_constant_arguments_recompile_per_value():
    """XLA takes a slice start given as a tensor as a constant: the program
    is specialised to its value and compiled again for another one."""
    bridged = BridgedFunction(tf.function(lambda x, i: tf.slice(x, [i, 0], [2, 4]), jit_compile=True))
    for i in (0, 1, 0):
        got = bridged(tf.constant(X), tf.constant(i))
        np.testing.assert_array_equal(np.asarray(got), X[i:i + 2])
    assert bridged.compile_count == 2


def test_outside_compilation_runs_on_the_host_with_its_transfers_predicted():
    from keras_ipu import scopes

    def fn(a):
        b = a * a
        with scopes.outside_compilation_scope():
            c = tf.sin(b) + 2.0
        return b + c

    bridged = BridgedFunction(tf.function(fn, jit_compile=True))
    got = bridged(tf.constant(X))
    np.testing.assert_allclose(np.asarray(got), X * X + np.sin(X * X) + 2, rtol=1e-6)
    cf, _, _, program = bridged.program((tf.constant(X),))
    regions = [n for n in program.graph.nodes if n.primitive is host_transfer.host_region_p]
    assert len(regions) == 1
    inner = {n.primitive.name for n in regions[0].params["graph"].nodes}
    assert "sin" in inner and "add" in inner
    pred = prediction.predict_costs(bridged.executable(program), log=False)
    stream = [s for s in pred.steps if s.kind == "stream"]
    assert len(stream) == 1
    # 48 bytes to the host and 48 back, over PCIe.
    target = pred.target
    assert stream[0].exchange == cost_model.stream_cycles(96, target)


def test_outside_compilation_scope_rules():
    from keras_ipu import scopes

    with pytest.raises(ValueError, match="only allowed in XLA context"):
        with scopes.outside_compilation_scope():
            pass

    def nested(a):
        with scopes.outside_compilation_scope():
            with scopes.outside_compilation_scope():
                return a + 1

    with pytest.raises(ValueError, match="Illegal nesting"):
        BridgedFunction(tf.function(nested, jit_compile=True))(tf.constant(X))


class _Stream:
    def __init__(self, values):
        self.values = list(values)
        self.sent = []
        self.id = host_streams.register(self)

    def receive(self, component, shape, dtype):
        return self.values.pop(0)

    def send(self, component, value):
        self.sent.append((component, value))


def test_stream_primitives_run_in_program_order_and_cost_pcie_time():
    from keras_ipu.device.compiler import compile_graph

    stream = _Stream([np.full((2, 2), 3.0, np.float32), np.full((2, 2), 4.0, np.float32)])

    def fn(token):
        token, a = host_transfer.stream_from_host_p.bind(
            token, stream=stream.id, component=0, shape=(2, 2), dtype=np.dtype(np.float32))
        token, b = host_transfer.stream_from_host_p.bind(
            token, stream=stream.id, component=0, shape=(2, 2), dtype=np.dtype(np.float32))
        token = host_transfer.stream_to_host_p.bind(token, ew.sub_p.bind(a, b),
                                                    stream=stream.id, component=1)
        return [token]

    graph, _ = trace_flat(fn, [ShapedArray((), np.uint32)])
    exe = compile_graph(graph, CompileOptions())
    (token,) = exe.run(np.zeros((), np.uint32))
    assert int(token) == 3
    assert [c for c, _ in stream.sent] == [1]
    np.testing.assert_array_equal(stream.sent[0][1], np.full((2, 2), -1.0))
    pred = prediction.predict_costs(exe, log=False)
    cycles = [s.exchange for s in pred.steps if s.kind == "stream"]
    target = get_target("ipu2")
    assert cycles == [cost_model.stream_cycles(16, target)] * 3
    # Hand computation: 5 us latency + 16 B at 32 GB/s, in 1.33 GHz cycles.
    assert cycles[0] == int(np.ceil((5e-6 + 16 / 32e9) * target.clock_hz))


def test_a_deleted_stream_is_named():
    with pytest.raises(host_streams.StreamClosedError, match="no longer exists"):
        host_streams.get(10**9)


def test_host_region_gradient_matches_finite_differences():
    from keras_ipu.device import autodiff

    def inner(token, x):
        return [token, ew.mul_p.bind(ew.sin_p.bind(x), x)]

    region, _ = trace_flat(inner, [ShapedArray((), np.uint32), ShapedArray((3,), np.float64)])

    def f(x):
        _, y = host_transfer.host_region_p.bind(np.zeros((), np.uint32), x, graph=region, name="r")
        return ew.mul_p.bind(y, y)

    x = np.array([0.3, -1.2, 2.0])
    g = np.ones(3)
    _, vjp = autodiff.vjp(f, x)
    (got,) = vjp(g)
    eps = 1e-6
    numeric = np.array([(np.asarray(f(x + eps * e)) - np.asarray(f(x - eps * e))).sum() / (2 * eps)
                        for e in np.eye(3)])
    np.testing.assert_allclose(np.asarray(got), numeric, rtol=1e-6)


def test_tracing_flag_is_scoped():
    from keras_ipu.frontends.tensorflow.function import tracing_for_ipu

    assert not tracing_for_ipu()
    with _Tracing():
        assert tracing_for_ipu()
    assert not tracing_for_ipu()


def test_out_of_memory_names_the_tensorflow_op():
    """A program that does not fit one IPU fails to compile, as Poplar's
    would, and the error names the TensorFlow op (nodes carry it)."""
    from keras_ipu.device.simulator.memory_model import IPUOutOfMemoryError

    def fn(a):
        # 3 x 576 MB: more than an IPU's 900 MB (nothing that large is ever
        # allocated: the compile refuses it first).
        big = tf.broadcast_to(a, (12000, 12000)) + 1.0
        return tf.matmul(big, big, name="huge_matmul")

    with pytest.raises(IPUOutOfMemoryError, match="huge_matmul"):
        BridgedFunction(tf.function(fn, jit_compile=True))(tf.ones((1, 12000)))


def test_executable_cache_path_serves_a_new_process(tmp_path, monkeypatch):
    """--executable_cache_path in TF_POPLAR_FLAGS: a bridged program is
    written to the cache directory, and a fresh process (an empty memory
    cache) tracing the same TensorFlow function loads it instead of
    compiling (Graphcore's TF2_recompilation tutorial relies on it)."""
    from keras_ipu.device.compiler import ExecutableCache
    from keras_ipu.device.compiler.cache import SUFFIX
    from keras_ipu.frontends.tensorflow import function as bridge_module

    monkeypatch.setenv("TF_POPLAR_FLAGS", f"--executable_cache_path={tmp_path}")

    def fn(x):
        return tf.nn.relu(x) * 3.0 + 1.0

    first = ExecutableCache()
    monkeypatch.setattr(bridge_module, "CACHE", first)
    out = BridgedFunction(tf.function(fn, jit_compile=True))(tf.constant(X))
    assert first.stats["compiles"] == 1
    assert [p.name.endswith(SUFFIX) for p in tmp_path.iterdir()] == [True]

    fresh = ExecutableCache()
    monkeypatch.setattr(bridge_module, "CACHE", fresh)
    again = BridgedFunction(tf.function(fn, jit_compile=True))(tf.constant(X))
    assert fresh.stats["disk_hits"] == 1 and fresh.stats["compiles"] == 0
    np.testing.assert_array_equal(np.asarray(out), np.asarray(again))
    np.testing.assert_allclose(np.asarray(out), np.maximum(X, 0) * 3 + 1, rtol=1e-6)
