"""How a bridged run writes its updated variables back: without a copy
when TensorFlow can take the executable's array, never aliasing an array
the caller still holds."""

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from tensorflow.python.ops import gen_resource_variable_ops  # noqa: E402

from keras_ipu.device.compiler.executable import Executable  # noqa: E402
from keras_ipu.device.compiler.host_memory import empty_aligned  # noqa: E402
from keras_ipu.frontends.tensorflow.function import BridgedFunction  # noqa: E402

SHAPE = (128, 160)  # 80 KiB of float32: allocated aligned (ALIGN_MIN_BYTES)


def _address(variable):
    return np.asarray(variable.read_value()).ctypes.data


def test_tensorflow_keeps_an_aligned_array_as_the_variables_buffer():
    # What the write-back relies on (host_memory.py): an eager assign of a
    # 64-byte aligned array makes it the variable's buffer, no copy.
    v = tf.Variable(np.zeros(SHAPE, np.float32))
    value = empty_aligned(SHAPE, np.float32)
    value[...] = 3.0
    gen_resource_variable_ops.assign_variable_op(v.handle, value)
    assert _address(v) == value.ctypes.data
    np.testing.assert_array_equal(v.numpy(), 3.0)


def test_a_momentum_steps_updates_are_taken_without_a_copy():
    w = tf.Variable(np.ones(SHAPE, np.float32))
    m = tf.Variable(np.zeros(SHAPE, np.float32))

    def step(g):
        m.assign(0.9 * m - 0.1 * g)
        w.assign_add(m)
        return tf.reduce_sum(w)

    bridged = BridgedFunction(step)
    g = np.full(SHAPE, 2.0, np.float32)
    outputs = []
    original = Executable.run

    def noting(self, *arrays):
        results = original(self, *arrays)
        outputs.extend(r for r in results if r.shape == SHAPE)
        return results

    Executable.run = noting
    try:
        bridged(g)
    finally:
        Executable.run = original
    np.testing.assert_allclose(m.numpy(), -0.2)
    np.testing.assert_allclose(w.numpy(), 0.8)
    # Each variable's buffer is the very array the executable returned.
    assert len(outputs) == 2
    assert {_address(w), _address(m)} == {a.ctypes.data for a in outputs}
    for a in outputs:
        assert a.ctypes.data % 64 == 0


def test_a_variable_set_to_an_argument_does_not_share_the_callers_array():
    v = tf.Variable(np.zeros(SHAPE, np.float32))

    def set_to(x):
        v.assign(x)
        return tf.reduce_sum(x)

    bridged = BridgedFunction(set_to)
    x = empty_aligned(SHAPE, np.float32)  # one TensorFlow would take as is
    x[...] = 1.0
    # The run hands its arrays to the variables uncopied; the argument's
    # must not be one of them (TensorFlow converts the call's arguments to
    # tensors before the executable sees them).
    bridged(x)
    x[...] = 7.0  # the caller reuses its array
    np.testing.assert_array_equal(v.numpy(), 1.0)
