"""A recompile storm (predict with a new batch size every call) keeps at
most the cache's capacity of programs alive and warns how to avoid it."""

import gc
import warnings

import keras
import numpy as np
import pytest

from keras_ipu.device.compiler import ExecutableCache
from keras_ipu.device.compiler.executable import Executable
from keras_ipu.device.jit import RECOMPILE_WARNING_AT
from keras_ipu.device.jit import RecompileWarning
from keras_ipu.device.jit import jit


def _alive_executables(name="predict_step_loop"):
    """Programs of that name alive (their loop bodies are Executables too)."""
    gc.collect()
    return sum(1 for o in gc.get_objects() if type(o) is Executable and o.name == name)


def test_predict_with_a_new_batch_size_each_call(monkeypatch):
    from keras_ipu.device.compiler import cache as cache_module

    monkeypatch.setattr(cache_module.CACHE, "capacity", 6)
    cache_module.CACHE.clear()
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    before = _alive_executables()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in range(1, 21):
            model.predict(np.ones((n, 3), np.float32), batch_size=n, verbose=0)
    alive = _alive_executables() - before
    assert alive <= 6, alive
    recompiles = [w for w in caught if issubclass(w.category, RecompileWarning)]
    assert [str(w.message).split(" times")[0] for w in recompiles] == [
        f"`predict_step_loop` has been compiled {n}" for n in (8, 16)
    ]
    text = str(recompiles[0].message)
    assert "f32[1,8,3]" in text  # the signature that made it 8
    assert "drop_remainder=True" in text and "batch_size" in text
    assert recompiles[0].filename == __file__  # points at the user's call
    # A dropped program compiles again when its signature returns.
    out = model.predict(np.ones((1, 3), np.float32), batch_size=1, verbose=0)
    assert out.shape == (1, 2)


def test_a_program_dropped_from_the_cache_is_compiled_again():
    cache = ExecutableCache(capacity=2)
    fast = jit(lambda x: x * 2.0, cache=cache)
    for n in (1, 2, 3):
        np.testing.assert_array_equal(fast(np.ones(n, np.float32)), np.full(n, 2.0))
    assert fast.signature_count == 2 and fast.trace_count == 3
    np.testing.assert_array_equal(fast(np.ones(1, np.float32)), [2.0])  # dropped: again
    assert fast.trace_count == 4 and cache.stats["compiles"] == 4
    fast(np.ones(1, np.float32))
    assert fast.trace_count == 4  # kept now


def test_fit_with_a_short_last_execution_does_not_warn():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile("sgd", "mse", steps_per_execution=4)
    x, y = np.ones((45, 3), np.float32), np.ones((45, 2), np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RecompileWarning)
        model.fit(x, y, batch_size=4, epochs=2, validation_split=0.2, verbose=0)
    assert RECOMPILE_WARNING_AT > 3


def test_a_tensorflow_function_called_with_many_shapes_keeps_the_cache_bounded(monkeypatch):
    """The TensorFlow front end: each new shape is a new program; the
    cache alone holds their executables, so at most its capacity stay
    alive, and a dropped one compiles again when its shape returns."""
    tf = pytest.importorskip("tensorflow")
    from keras_ipu.device.compiler import cache as cache_module
    from keras_ipu.frontends.tensorflow.function import BridgedFunction

    monkeypatch.setattr(cache_module.CACHE, "capacity", 4)
    cache_module.CACHE.clear()

    def doubled(x):
        return x * 2.0

    bridged = BridgedFunction(tf.function(doubled, jit_compile=True))
    for n in range(1, 13):
        bridged(tf.constant(np.ones(n, np.float32)))
    assert _alive_executables("doubled") <= 4
    np.testing.assert_array_equal(bridged(tf.constant(np.ones(1, np.float32))), [2.0])


def test_a_tensorflow_function_compiled_for_many_shapes_warns():
    """The front end's programs get the same RecompileWarning (TensorFlow's
    own retracing warning does not fire on this path)."""
    tf = pytest.importorskip("tensorflow")
    from keras_ipu.frontends.tensorflow.function import BridgedFunction

    def tripled(x):
        return x * 3.0

    bridged = BridgedFunction(tf.function(tripled, jit_compile=True))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in range(1, RECOMPILE_WARNING_AT + 1):
            bridged(tf.constant(np.ones(n, np.float32)))
    (warning,) = [w for w in caught if issubclass(w.category, RecompileWarning)]
    assert f"`tripled` has been compiled {RECOMPILE_WARNING_AT} times" in str(warning.message)
    assert f"f32[{RECOMPILE_WARNING_AT}]" in str(warning.message)
    assert warning.filename == __file__
