"""int64 data in compiled programs: never wrapped to int32 silently.

Integer features and targets that the model only uses as floats are
converted on the host from int64 to the float type (as Keras' TensorFlow
backend does); integers the device must hold as int32 (ids, indices) are
range-checked on the host, and a value out of range fails naming the
tensor, the value and the fix."""

import os
import subprocess
import sys
import textwrap
import warnings

import keras
import numpy as np
import pytest

from keras_ipu.device.compiler.demotion import DemotionWarning
from keras_ipu.device.compiler.demotion import InputRangeError
from keras_ipu.device.jit import jit

BIG = 3_000_000_000  # > 2**31: wraps to -1294967296 as int32


def _dense():
    model = keras.Sequential([
        keras.Input((1,)),
        keras.layers.Dense(1, kernel_initializer="ones", bias_initializer="zeros"),
    ])
    model.compile("sgd", "mse")
    return model


def test_integer_features_are_floats_on_the_device_as_on_tensorflow():
    model = _dense()
    with warnings.catch_warnings():
        warnings.simplefilter("error", DemotionWarning)  # nothing is demoted
        out = model.predict(np.array([[BIG], [7]]), verbose=0)
    np.testing.assert_array_equal(out, [[float(BIG)], [7.0]])


def test_integer_targets_of_a_regression_loss_are_not_wrapped():
    model = _dense()
    loss = model.evaluate(np.zeros((1, 1), np.float32), np.array([[BIG]]), verbose=0)
    np.testing.assert_allclose(loss, float(np.float32(BIG)) ** 2, rtol=1e-6)


def _embedding_model():
    model = keras.Sequential([
        keras.Input((2,), dtype="int64"),
        keras.layers.Embedding(10, 2),
        keras.layers.Flatten(),
        keras.layers.Dense(1),
    ])
    model.compile("sgd", "mse")
    return model


def test_ids_out_of_the_int32_range_fail_naming_the_tensor_value_and_fix():
    model = _embedding_model()
    ids = np.array([[1, 2], [3, BIG]])
    before = [np.array(v) for v in model.variables]
    with pytest.raises(InputRangeError) as info:
        model.fit(ids, np.ones((2, 1), np.float32), verbose=0)
    text = str(info.value)
    assert text.startswith(f"x holds the value {BIG} (int64)")
    assert "int32" in text and "astype('float32')" in text and "np.unique" in text
    for value, variable in zip(before, model.variables):  # nothing ran
        np.testing.assert_array_equal(value, np.array(variable))
    # In range, int64 ids work as before.
    assert model.predict(np.array([[1, 2]]), verbose=0).shape == (1, 1)


def test_the_name_follows_the_batch_structure():
    inputs = {"ids": keras.Input((2,), dtype="int64", name="ids"),
              "extra": keras.Input((1,), name="extra")}
    hidden = keras.layers.Flatten()(keras.layers.Embedding(10, 2)(inputs["ids"]))
    output = keras.layers.Dense(1)(keras.layers.Concatenate()([hidden, inputs["extra"]]))
    model = keras.Model(inputs, output)
    model.compile("sgd", "mse")
    # Not "dense": Dense(1) takes that name when no Dense was made before it
    # in the worker, and two layers of one model cannot share a name.
    x = {"ids": np.array([[1, -BIG]]), "extra": np.ones((1, 1), np.float32)}
    with pytest.raises(InputRangeError, match=rf"^x\['ids'\] holds the value -{BIG} "):
        model.fit(x, np.ones((1, 1), np.float32), verbose=0)


def test_jit_names_the_argument():
    add = jit(lambda x, table: table["k"] + x)
    with pytest.raises(InputRangeError, match=r"^argument 1\['k'\] of `<lambda>` holds"):
        add(np.int32(1), {"k": np.array([2**40])})
    np.testing.assert_array_equal(add(np.int32(1), {"k": np.array([2**30])}), [2**30 + 1])
    # A Python int beyond int32 that the program uses as a float is exact.
    as_float = jit(lambda n: keras.ops.cast(n, "float32") * 2.0)
    assert float(as_float(BIG)) == 2.0 * BIG


def test_the_demotion_warning_points_at_the_users_call():
    model = _embedding_model()
    with pytest.warns(DemotionWarning) as caught:  # a shape no other test compiles
        model.predict(np.array([[1, 2]] * 5), batch_size=5, verbose=0)
    assert caught[0].filename == __file__
