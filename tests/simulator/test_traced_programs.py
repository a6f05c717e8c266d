"""Cost and memory predictions of programs traced from the ipu backend's own
ops (the params the backend really emits), compiled to executables."""

import numpy as np
import pytest

from keras_ipu.device import autodiff
from keras_ipu.device.compiler import compile_graph
from keras_ipu.device.ir import ShapedArray
from keras_ipu.device.simulator import cost_model as cm
from keras_ipu.device.simulator.prediction import predict_costs
from keras_ipu.device.trace import trace_flat


def _ops():
    import keras

    if keras.backend.backend() != "ipu":
        pytest.skip("needs KERAS_BACKEND=ipu")
    return keras.ops


def test_cnn_forward_costs_every_step():
    ops = _ops()

    def fn(x, k, idx):
        y = ops.conv(x, k, strides=1, padding="same")
        y = ops.relu(y)
        y = ops.max_pool(y, pool_size=2, strides=2)
        y = ops.reshape(y, (4, -1))
        y = ops.softmax(y)
        z = ops.take(y, idx, axis=1)
        return [ops.mean(z), ops.cumsum(y, axis=1), ops.sort(y, axis=-1)]

    avals = [ShapedArray((4, 8, 8, 3), "float32"), ShapedArray((3, 3, 3, 16), "float32"),
             ShapedArray((5,), "int32")]
    graph, captures = trace_flat(fn, avals)
    assert not captures
    exe = compile_graph(graph)
    p = predict_costs(exe, target="ipu2", batch_size=4)
    kinds = {s.kind for s in p.steps}
    assert "matmul" in kinds and "sort" in kinds
    conv = [s for s in p.steps if s.name == "conv_general_dilated"][0]
    assert conv.macs == 4 * 8 * 8 * 16 * 27
    assert p.cycles == sum(s.cycles for s in p.steps) > 0
    assert p.memory.fits and p.memory.not_always_live_bytes > 0
    assert np.isfinite(p.samples_per_second)


def test_training_step_with_gradients():
    ops = _ops()

    def loss(x, w, idx):
        h = ops.tanh(ops.matmul(x, w))
        return ops.mean(ops.square(ops.take(h, idx, axis=0))) + ops.mean(ops.max(h, axis=1))

    def step(x, w, idx):
        out, pull = autodiff.vjp(lambda w: loss(x, w, idx), w)
        (g,) = pull(ops.ones_like(out))
        return [out, w - 0.1 * g]

    avals = [ShapedArray((32, 16), "float32"), ShapedArray((16, 8), "float32"),
             ShapedArray((4,), "int32")]
    graph, _ = trace_flat(step, avals)
    exe = compile_graph(graph)
    names = {n.primitive.name for n in exe.steps}
    assert {"scatter", "gather", "dot_general"} <= names
    p = predict_costs(exe, target="ipu2", batch_size=32, resident_inputs=(1,))
    # Forward matmul and the weight gradient: 32x16x8 MACs each (x is not
    # differentiated, so no third).
    assert sum(s.macs for s in p.steps) == 2 * 32 * 16 * 8
    # The gather of 4 rows of h (f32[32,8]) moves those 4 rows only.
    gather = [s for s in p.steps if s.name == "gather"][0]
    assert gather.exchange == cm.exchange_cycles(4 * 8 * 4, gather.tiles)
    assert p.host_bytes_in == (32 * 16 + 4) * 4


def test_in_place_update_writes_the_update_only():
    from keras_ipu.device.primitives import REGISTRY

    x, u, i = ShapedArray((1024,), "float32"), ShapedArray((16,), "float32"), ShapedArray((), "int32")
    c = REGISTRY["dynamic_update_slice"].cost((x, u, i), (x,))
    assert (c.bytes_out, c.kind) == (64, "copy")
    assert cm.exchange_bytes(c, None) == 64
